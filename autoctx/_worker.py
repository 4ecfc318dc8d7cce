"""`AutoContextWorker` (the `autoctx worker` command): processes that compress, for every agent
of a database, the sessions that are over their trigger, so that the agents never do.

Each worker thread looks for a due session (over its token or message trigger, by the
thresholds recorded on the session, and not settled at its version), claims it
(`autoctx._store.claims`: a row lock on the session's claim, which any number of worker
processes and threads share safely, so no session is ever compressed by two of them at once,
and which a role granted another tenant cannot take), runs the compression
loop on it exactly as `compress_if_needed()` would, and releases the claim. The agents open
their memories with ``background="worker"``: they never compress at the trigger, and at the
window they wait for the worker's compression (its claim) before compressing what is still
over themselves.

With no session due, a worker thread fills the search vectors the appends left (a batch per
short transaction, `autoctx._store.search.fill_waiting_vectors`): the append path never
computes them (migration 0013), and with a worker running no search computes them either.

The summarizer is the process's: `OPENAI_BASE_URL` / `OPENAI_API_KEY` (and
`AUTOCTX_SUMMARY_MODEL`) as everywhere else in autoctx, the offline one without them (or with
``--offline``). A stop (`stop()`, or SIGTERM / SIGINT under `run_until_signalled`) lets no
compression write anything after it: each ends at its next step, an answer in flight is
dropped, and the session stays exactly as its last commit left it.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType

from sqlalchemy.engine import URL

from . import _arguments
from ._client import AutoContextClient
from ._config import RuntimeOptions, options_argument
from ._errors import ConfigError
from ._events import Event
from ._memory import internals
from ._observe import CompressionHooks
from ._store.claims import DueSession, SessionClaim, claim_due
from ._store.search import FILL_BATCH, fill_waiting_vectors
from ._summarizers import Summarizer, default_summarizer, describe_summarizer

logger = logging.getLogger("autoctx")


@dataclass(frozen=True, slots=True)
class Compressed:
    """What one claim of a session did."""

    session_id: str
    tenant: str | None
    events: list[Event]

    @property
    def applied(self) -> int:
        return sum(e.status == "applied" for e in self.events)

    @property
    def failed(self) -> int:
        return sum(e.status == "failed" for e in self.events)


class _WorkerClient(AutoContextClient):
    """The worker's client: the memories it opens (one per compressed session) name their
    summarizer at DEBUG only, since it is the worker's, named once when the worker starts."""

    _summarizer_log_level = logging.DEBUG


class AutoContextWorker:
    """Compress the due sessions of one database, in `threads` threads, until stopped.

    >>> worker = AutoContextWorker("postgresql+psycopg://localhost/agents")  # doctest: +SKIP
    >>> worker.run(once=True)  # compress what is due now, then return how many  # doctest: +SKIP
    """

    def __init__(
        self,
        database_url: str | URL | None = None,
        *,
        summarizer: Summarizer | None = None,
        threads: int = 1,
        poll_s: float = 1.0,
        tenant: str | None = None,
        on_compressed: Callable[[Compressed], None] | None = None,
        auto_upgrade: bool = True,
        hooks: CompressionHooks | Sequence[CompressionHooks] | None = None,
        options: RuntimeOptions | None = None,
    ) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError(
                f"AutoContextWorker: threads must be a positive integer, got {threads!r}"
            )
        if isinstance(poll_s, bool) or not isinstance(poll_s, int | float) or not poll_s > 0:
            raise ConfigError(
                f"AutoContextWorker: poll_s must be a positive number of seconds, got {poll_s!r}"
            )
        self.tenant = _arguments.tenant(tenant)
        #: How this worker runs each compression (passes, deadlines, strictness): its own, as
        #: a memory's are, never read from the sessions it compresses.
        self.options = options_argument(options)
        self.threads = threads
        self.poll_s = float(poll_s)
        self.on_compressed = on_compressed
        self._owns_summarizer = summarizer is None
        self.summarizer = summarizer if summarizer is not None else default_summarizer()
        # Once per worker, as a memory does when it opens: which summarizer, and why.
        logger.info(
            "autoctx worker: %s", describe_summarizer(self.summarizer, given=summarizer is not None)
        )
        # The lifecycle hooks observe every compression of the worker (its client's).
        self.client: AutoContextClient = _WorkerClient(
            database_url, auto_upgrade=auto_upgrade, hooks=hooks
        )
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._compressions = 0
        #: Sessions whose compression raised, and looks for due sessions that failed (the
        #: database), since the worker was built: `autoctx worker --once` exits non-zero when
        #: its run added any.
        self._failures = 0
        #: Sessions whose compression raised, with the version they were at: not claimed
        #: again until they change (a session that always fails must not spin a worker).
        self._failed: dict[str, int] = {}
        #: Sessions a compression left as they were, with that version: not claimed again
        #: until they change.
        self._idle: dict[str, int] = {}

    # -- running ---------------------------------------------------------------------------

    def run(self, *, once: bool = False) -> int:
        """Compress due sessions until `stop()` (with `once`, until none is due and free);
        returns how many compressions this call made."""
        start = self._compressions
        workers = [
            threading.Thread(
                target=self._work, args=(once,), name=f"autoctx-worker-{k}", daemon=True
            )
            for k in range(self.threads)
        ]
        for t in workers:
            t.start()
        for t in workers:
            # Joined in short waits, so that the main thread stays free for signal handlers.
            while t.is_alive():
                t.join(0.2)
        return self._compressions - start

    def stop(self) -> None:
        """Stop: no compression writes anything after this; `run` returns once the threads
        see it (a thread waiting on the summarizer sees it when the answer comes)."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def compressions(self) -> int:
        """Compressions made since the worker was built."""
        return self._compressions

    @property
    def failures(self) -> int:
        """Failures since the worker was built: a session whose compression raised (its stored
        config cannot be read, the database failed under it, ...), or a look for due sessions
        that the database refused. Each is logged with the session id and the error's type,
        never with content; the other sessions go on being compressed."""
        return self._failures

    def close(self) -> None:
        """Stop, and release the database connections and the summarizer the worker made."""
        self.stop()
        self.client.close()
        close = getattr(self.summarizer, "close", None)
        if self._owns_summarizer and callable(close):
            close()

    def __enter__(self) -> AutoContextWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one thread ------------------------------------------------------------------------

    def _work(self, once: bool) -> None:
        while not self._stop.is_set():
            try:
                claimed = self._claim()
            except Exception as exc:  # the database went away: try again after a pause
                logger.warning(
                    "autoctx worker: looking for due sessions failed (%s)", type(exc).__name__
                )
                with self._lock:
                    self._failures += 1
                claimed = None
                if once:
                    return
            if claimed is None:
                # Nothing due: fill search vectors (a batch at a time), then look again.
                if self._fill() == FILL_BATCH:
                    continue
                if once:
                    return
                self._stop.wait(self.poll_s)
                continue
            due, claim = claimed
            try:
                self._compress(due)
            finally:
                claim.release()

    def _fill(self) -> int:
        """One batch of the search vectors still waiting (the append path leaves them to
        whoever searches first, or to the worker when it has nothing due); 0 on a failure,
        logged with its type only."""
        try:
            return fill_waiting_vectors(self.client.engine, tenant=self.tenant)
        except Exception as exc:
            logger.warning("autoctx worker: filling search vectors failed (%s)", type(exc).__name__)
            return 0

    def _claim(self) -> tuple[DueSession, SessionClaim] | None:
        with self._lock:
            skip = {**self._idle, **self._failed}
        return claim_due(self.client.engine, tenant=self.tenant, skip=skip)

    def _compress(self, due: DueSession) -> None:
        try:
            mem = self.client.open(
                due.session_id,
                tenant=due.tenant,
                summarizer=self.summarizer,
                create=False,
                options=self.options,
            )
            try:
                # The memory's own loop (the thresholds recorded on the session, this worker's
                # runtime options), stopped with the worker; the claim keeps every other
                # worker off the session meanwhile.
                inner = internals(mem)
                compressor, info = inner.compression()
                events = compressor.run(info, guard=inner.lock, stop=self._stop)
            finally:
                mem.close()
        except Exception as exc:
            # The type only: a database error's text may carry what the session holds. An
            # InvalidStoredConfig names the session and the fix; the other sessions go on.
            logger.warning(
                "autoctx worker: compressing session %r failed (%s); it is tried again once it "
                "changes",
                due.session_id,
                type(exc).__name__,
            )
            with self._lock:
                self._failed[due.session_id] = due.version
                self._failures += 1
            return
        with self._lock:
            self._failed.pop(due.session_id, None)
            if any(e.status == "applied" for e in events):
                self._idle.pop(due.session_id, None)
            else:
                # Nothing changed it (the summarizer failed, or the ladder found nothing): it
                # is still due at the same version, and must not take the worker's every look
                # from the sessions behind it.
                self._idle[due.session_id] = due.version
            self._compressions += 1
        if self.on_compressed is not None:
            self.on_compressed(Compressed(due.session_id, due.tenant, events))


def run_until_signalled(worker: AutoContextWorker, *, once: bool, grace_s: float) -> int:
    """`worker.run` in the main thread until SIGTERM or SIGINT, which stop it: the threads get
    `grace_s` seconds to see the stop (a summarizer call in flight is not waited for past
    that; nothing of it would be written). Returns the number of compressions made."""
    stopped_at: list[float] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stopped_at:
            raise KeyboardInterrupt  # a second signal: leave now
        stopped_at.append(signum)
        logger.info("autoctx worker: %s received, stopping", signal.Signals(signum).name)
        worker.stop()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    done: list[int] = []
    runner = threading.Thread(target=lambda: done.append(worker.run(once=once)), daemon=True)
    try:
        runner.start()
        while runner.is_alive() and not worker.stopped:
            runner.join(0.2)
        if runner.is_alive():
            runner.join(grace_s)
    except KeyboardInterrupt:
        pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return done[0] if done else worker.compressions
