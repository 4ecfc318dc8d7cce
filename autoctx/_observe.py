"""Watching compressions as they happen: lifecycle hooks, and OpenTelemetry spans.

Hooks are the application's callables (`CompressionHooks`): before a strategy's attempt, after
each event it applied, and on each failure. They are called in the thread that compresses (the
caller's, a background thread, or a worker thread of the async memory), while the memory's
lock is held, so they see the session exactly as the event left it; a hook that raises is
logged (its type only: its text may quote what it was given) and the compression goes on.

Spans go through the OpenTelemetry API when the `opentelemetry-api` package is installed (the
`autoctx[otel]` extra); without it nothing is imported and nothing is spent. One span per
attempt of a strategy (`autoctx.compress`), and a child span per summarizer call named as the
GenAI semantic conventions name an inference (`chat <model>`, with `gen_ai.operation.name`,
`gen_ai.request.model`, `gen_ai.usage.input_tokens`, ...). No span carries message content.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ._errors import ConfigError
from ._events import Event, FactCheck

if TYPE_CHECKING:
    from ._summary import Summarizer, SummaryResult

logger = logging.getLogger("autoctx")

try:  # the optional extra: autoctx[otel]
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
except ImportError:  # pragma: no cover - exercised by a test in a process without it
    otel_context = None  # type: ignore[assignment]
    otel_trace = None  # type: ignore[assignment]

#: The instrumentation scope of autoctx's spans.
TRACER_NAME: Final = "autoctx"
#: The name of the span of one strategy's attempt.
COMPRESS_SPAN: Final = "autoctx.compress"
#: Statuses of an event that the failure hook receives (an applied event goes to `after`).
FAILURE_STATUSES: Final = frozenset({"failed", "conflict", "skipped"})


@dataclass(frozen=True, slots=True)
class SummarizerUsage:
    """What the summarizer spent on one event: its model, tokens and latency."""

    model: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_ms: float | None


@dataclass(frozen=True, slots=True)
class CompressionInfo:
    """What a hook receives.

    Before an attempt, `tokens_after`, `usage` and `event` are None; after it (and on a
    failure), they are those of the one event the hook is called for."""

    session_id: str
    #: 1-7 (7 is the fold), as on the events.
    strategy: int
    #: Why it ran: 'tokens', 'count' (the trigger that held) or 'fallback' (the offline
    #: summarizer keeps the bound).
    reason: str
    tokens_before: int
    tokens_after: int | None = None
    usage: SummarizerUsage | None = None
    event: Event | None = None
    #: The fact check of the summary the event wrote (docs/design.md §6): facts found, kept,
    #: repaired, listed on the index line and dropped; None before an attempt, for a preview,
    #: and for an event that changed nothing.
    facts: FactCheck | None = None


Hook = Callable[[CompressionInfo], None]


@dataclass(frozen=True, slots=True)
class CompressionHooks:
    """Callables an application registers to observe compressions (any of them may be None).

    `before` is called before a strategy's attempt (before its summarizer call), `after` for
    each event the attempt applied, `on_failure` for each event that records a failure (a
    summarizer failure, a conflict with another writer, the window still exceeded). Register
    them for one memory (`AutoContextMemory.open(..., hooks=...)`) or for every memory of a
    client (`AutoContextClient(url, hooks=...)`)."""

    before: Hook | None = None
    after: Hook | None = None
    on_failure: Hook | None = None

    def __post_init__(self) -> None:
        for name in ("before", "after", "on_failure"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ConfigError(
                    f"CompressionHooks: {name} must be a callable taking a CompressionInfo (or "
                    f"None), got {type(value).__name__}"
                )


def hooks_of(hooks: object) -> tuple[CompressionHooks, ...]:
    """The hooks a caller registers: None, one `CompressionHooks`, or a sequence of them."""
    if hooks is None:
        return ()
    if isinstance(hooks, CompressionHooks):
        return (hooks,)
    if isinstance(hooks, list | tuple) and all(isinstance(h, CompressionHooks) for h in hooks):
        return tuple(hooks)
    raise ConfigError(
        f"hooks must be a CompressionHooks (or a list of them), got {type(hooks).__name__}; "
        "build one with CompressionHooks(before=..., after=..., on_failure=...)"
    )


def _usage(event: Event) -> SummarizerUsage | None:
    if event.model is None and event.prompt_tokens is None and event.latency_ms is None:
        return None
    return SummarizerUsage(
        event.model, event.prompt_tokens, event.completion_tokens, event.latency_ms
    )


class Observer:
    """The hooks and spans of one `compress_if_needed()` call (or background compression)."""

    def __init__(self, session_id: str, hooks: Sequence[CompressionHooks] = ()) -> None:
        self.session_id = session_id
        self.hooks = tuple(hooks)
        self._tracer: Any = None
        #: The caller's context when the call began: the parent of its spans, whichever
        #: thread later runs the steps.
        self._parent: Any = None
        if otel_trace is not None:
            self._tracer = otel_trace.get_tracer(TRACER_NAME)
            self._parent = otel_context.get_current()
        self._attempt: Attempt | None = None

    def begin(self, strategy: int, reason: str, tokens_before: int, messages: int) -> Attempt:
        """An attempt of `strategy` starts: the `before` hooks, and its span."""
        span = None
        if self._tracer is not None:
            span = self._tracer.start_span(
                COMPRESS_SPAN,
                context=self._parent,
                attributes={
                    "gen_ai.conversation.id": self.session_id,
                    "autoctx.strategy": strategy,
                    "autoctx.reason": reason,
                    "autoctx.tokens_before": tokens_before,
                    "autoctx.messages_before": messages,
                },
            )
        attempt = Attempt(self, strategy, reason, tokens_before, span)
        self._attempt = attempt
        self._call("before", CompressionInfo(self.session_id, strategy, reason, tokens_before))
        return attempt

    def summarizer_call(self, summarizer: Summarizer | None, model: str | None) -> SummarizerCall:
        """The span of one summarizer call of the current attempt (a no-op without tracing)."""
        attempt = self._attempt
        if attempt is None:
            return SummarizerCall(None)
        return attempt.summarizer_call(summarizer, model)

    def recorded(self, event: Event) -> None:
        """An event was committed: the `after` or `on_failure` hooks, and the attempt's span."""
        if self._attempt is not None:
            self._attempt.saw(event)
        info = CompressionInfo(
            self.session_id,
            event.strategy,
            event.reason,
            event.tokens_before,
            event.tokens_after,
            _usage(event),
            event,
            event.facts,
        )
        self._call("on_failure" if event.status in FAILURE_STATUSES else "after", info)

    def _call(self, which: str, info: CompressionInfo) -> None:
        for hooks in self.hooks:
            hook = getattr(hooks, which)
            if hook is None:
                continue
            try:
                hook(info)
            except Exception as exc:  # an application's hook may raise anything
                logger.warning(
                    "autoctx: session %r: the %s hook raised %s; the compression goes on",
                    self.session_id,
                    which,
                    type(exc).__name__,
                )


class Attempt:
    """One strategy's attempt: its span (when tracing) and the summarizer calls under it."""

    def __init__(
        self, observer: Observer, strategy: int, reason: str, tokens_before: int, span: Any
    ) -> None:
        self.observer = observer
        self.strategy = strategy
        self.span = span
        self.statuses: list[str] = []
        self.tokens_after: int | None = None
        #: The fact checks of the attempt's applied summaries, summed (`end`).
        self.facts: dict[str, int] = {}

    def saw(self, event: Event) -> None:
        self.statuses.append(event.status)
        if event.status == "applied":
            self.tokens_after = event.tokens_after
            if event.facts is not None:
                for name, value in _fact_attributes(event.facts).items():
                    self.facts[name] = self.facts.get(name, 0) + value
        if event.status == "failed" and self.span is not None and event.error:
            # The machine reason only (the detail names the endpoint, never content).
            self.span.add_event(
                "autoctx.failure",
                {"error.type": event.error.split(":", 1)[0], "event.id": event.id},
            )

    def summarizer_call(self, summarizer: Summarizer | None, model: str | None) -> SummarizerCall:
        """A child span for one summarizer call (a no-op without tracing)."""
        if self.span is None or otel_trace is None:
            return SummarizerCall(None)
        requested = model or getattr(summarizer, "model", None) or type(summarizer).__name__
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": str(requested),
            "gen_ai.conversation.id": self.observer.session_id,
            "autoctx.strategy": self.strategy,
        }
        attributes.update(_provider_of(summarizer))
        span = self.observer._tracer.start_span(
            f"chat {requested}",
            context=otel_trace.set_span_in_context(self.span),
            kind=otel_trace.SpanKind.CLIENT,
            attributes=attributes,
        )
        return SummarizerCall(span)

    def end(self) -> None:
        span = self.span
        if span is None:
            return
        statuses = self.statuses
        span.set_attribute("autoctx.events", len(statuses))
        if statuses:
            span.set_attribute(
                "autoctx.status", statuses[-1] if len(set(statuses)) == 1 else "mixed"
            )
        if self.tokens_after is not None:
            span.set_attribute("autoctx.tokens_after", self.tokens_after)
        for name, value in self.facts.items():
            span.set_attribute(name, value)
        if statuses and "applied" not in statuses and otel_trace is not None:
            span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, "nothing applied"))
        span.end()
        if self.observer._attempt is self:
            self.observer._attempt = None


class SummarizerCall:
    """The span of one summarizer call, ended with its answer or its failure."""

    def __init__(self, span: Any) -> None:
        self.span = span

    def answered(self, result: SummaryResult) -> None:
        span, self.span = self.span, None  # ended once, whatever comes after
        if span is None:
            return
        if result.model:
            span.set_attribute("gen_ai.response.model", result.model)
        if result.prompt_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", result.prompt_tokens)
        if result.completion_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", result.completion_tokens)
        span.end()

    def failed(self, reason: str) -> None:
        span, self.span = self.span, None
        if span is None or otel_trace is None:
            return
        span.set_attribute("error.type", reason)
        span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, reason))
        span.end()


def _fact_attributes(facts: FactCheck) -> dict[str, int]:
    """The span attributes of a fact check (counts only: never the facts themselves)."""
    return {
        "autoctx.facts.found": facts.found,
        "autoctx.facts.kept": facts.kept,
        "autoctx.facts.repaired": facts.repaired,
        "autoctx.facts.listed": facts.listed,
        "autoctx.facts.dropped": facts.dropped,
    }


def _provider_of(summarizer: Summarizer | None) -> dict[str, Any]:
    """`gen_ai.provider.name` and the server's address, for an OpenAI-compatible summarizer."""
    client = getattr(summarizer, "client", None)
    base_url = getattr(client, "base_url", None)
    if base_url is None:
        return {}
    out: dict[str, Any] = {"gen_ai.provider.name": "openai"}
    host = getattr(base_url, "host", None)
    port = getattr(base_url, "port", None)
    if host:
        out["server.address"] = str(host)
    if isinstance(port, int):
        out["server.port"] = port
    return out
