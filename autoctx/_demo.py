"""The demo: a long, realistic agent session, generated deterministically, run through a memory.

`autoctx demo` (see `autoctx._cli`) feeds what `generate()` yields into an `AutoContextMemory`,
one agent step at a time, and calls `compress_if_needed()` after each step, so every strategy of
the ladder can be watched as it fires. The session is a coding agent working on a small Python
service: a system prompt; several user rounds, each a ReAct loop (thought + tool calls, parallel
ones included, then their results) closed by a final answer; then one long task (a single user
request followed by hundreds of tool steps), the case where the current round keeps growing.

Everything here is plain data (OpenAI Chat Completions messages) from a seeded `random.Random`:
the same seed gives the same session, byte for byte, on every machine.

>>> from autoctx._demo import generate
>>> steps = list(generate(rounds=2, steps=10, seed=7))
>>> steps[0].messages[0]["role"]
'system'
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from ._config import AutoContextConfig
from ._events import Event
from ._messages import Msg
from ._prompts import RELOAD_SNIPPET

__all__ = [
    "DEFAULT_ROUNDS",
    "DEFAULT_SEED",
    "DEFAULT_STEPS",
    "SESSION_PREFIX",
    "DemoMemory",
    "DemoResult",
    "DemoStep",
    "demo_config",
    "generate",
    "new_session_id",
    "run",
]

SESSION_PREFIX: Final = "demo-"
DEFAULT_ROUNDS: Final = 6
DEFAULT_STEPS: Final = 260
DEFAULT_SEED: Final = 42

OpenAIMessage = dict[str, Any]


def demo_config() -> AutoContextConfig:
    """A small window so that compression happens often and every strategy gets its turn.

    A 32k-token window with a 120-message trigger and a 20-message protected tail: the rounds
    fill it with tool runs (S1), big pasted logs and file dumps (S2, S3) and finished rounds,
    which the fold (7) keeps in one rolling summary (S4 would need a call per round); the long
    task brings big outputs into the current round (S5) and, once its own summaries pile up,
    the last resort (S6).
    """
    return AutoContextConfig(
        max_tokens=32_000,
        msg_threshold=120,
        last_keep=20,
        min_compress_tokens=1_500,
        large_payload_chars=3_000,
        preview_chars=200,
        reload_page_chars=2_000,
    )


def new_session_id() -> str:
    """``demo-<UTC timestamp>-<4 hex>``: sortable, and two demos in one second still differ."""
    tail = random.SystemRandom().randrange(16**4)
    return f"{SESSION_PREFIX}{datetime.now(UTC):%Y%m%d-%H%M%S}-{tail:04x}"


@dataclass(frozen=True, slots=True)
class DemoStep:
    """One `add()` of the demo: what an agent loop appends in one go."""

    #: "setup", "round N" or "task".
    phase: str
    #: OpenAI Chat Completions messages.
    messages: list[OpenAIMessage]
    #: Counts toward the progress bar (the system prompt and user messages do not).
    is_step: bool = True


# ---------------------------------------------------------------------------------------------
# The fictional project the agent works on
# ---------------------------------------------------------------------------------------------

_REPO: Final = "/srv/inventory"
_MODULES: Final = (
    "src/inventory/__init__.py",
    "src/inventory/api/orders.py",
    "src/inventory/api/products.py",
    "src/inventory/api/auth.py",
    "src/inventory/db/session.py",
    "src/inventory/db/models.py",
    "src/inventory/db/queries.py",
    "src/inventory/services/pricing.py",
    "src/inventory/services/stock.py",
    "src/inventory/services/notifications.py",
    "src/inventory/workers/reindex.py",
    "src/inventory/config.py",
    "tests/test_orders.py",
    "tests/test_pricing.py",
    "tests/test_stock.py",
    "tests/conftest.py",
)
_NOUNS: Final = (
    "order", "product", "sku", "warehouse", "price", "discount", "customer", "invoice",
    "shipment", "reservation", "batch", "supplier", "token", "session", "quota", "ledger",
)  # fmt: skip
_VERBS: Final = (
    "load", "save", "compute", "validate", "reserve", "release", "apply", "refresh",
    "lookup", "render", "publish", "reconcile", "expire", "merge",
)  # fmt: skip
_ERRORS: Final = (
    ("AssertionError", "assert 500 == 200"),
    ("KeyError", "'warehouse_id'"),
    ("sqlalchemy.exc.IntegrityError", 'duplicate key value violates unique constraint "sku_key"'),
    ("TypeError", "compute_price() got an unexpected keyword argument 'currency'"),
    ("AttributeError", "'NoneType' object has no attribute 'quantity'"),
    ("decimal.InvalidOperation", "[<class 'decimal.ConversionSyntax'>]"),
    ("TimeoutError", "reservation lock not acquired within 5.0s"),
)
_REQUESTS: Final = (
    "The order API returns 500 when a product has no warehouse. Find the cause and fix it.",
    "Add a `currency` parameter to the pricing service and make the tests pass.",
    "Stock reservations sometimes leak under load. Investigate and propose a fix.",
    "Why is tests/test_pricing.py flaky on CI? Make it deterministic.",
    "Add an endpoint GET /api/products/{sku}/history with pagination.",
    "The reindex worker is slow. Profile it and speed it up.",
    "Rename `lookup_sku` to `find_product` everywhere, keeping a deprecated alias.",
    "Customers get duplicate notification emails. Find out why.",
)
_TASK: Final = (
    "Migrate the whole codebase from the legacy `db.query(...)` helpers to SQLAlchemy 2 "
    "`select()` statements, module by module, keep every test green after each module, and "
    "tell me at the end what changed and what is left."
)


class _Writer:
    """Realistic tool outputs from one seeded random source."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.calls = 0

    def call_id(self) -> str:
        self.calls += 1
        return f"call_{self.rng.getrandbits(40):010x}{self.calls:04d}"

    def ident(self) -> str:
        return f"{self.rng.choice(_VERBS)}_{self.rng.choice(_NOUNS)}"

    def module(self, tests: bool | None = None) -> str:
        pool = [m for m in _MODULES if tests is None or m.startswith("tests/") == tests]
        return self.rng.choice(pool)

    # -- outputs ------------------------------------------------------------------------------

    def source(self, path: str, min_chars: int, max_chars: int) -> str:
        """A numbered listing of a Python module (`cat -n` style)."""
        rng = self.rng
        target = rng.randint(min_chars, max_chars)
        lines = [
            f'"""{path.rsplit("/", 1)[-1][:-3].replace("_", " ").title()}: '
            f'{rng.choice(_VERBS)} {rng.choice(_NOUNS)}s for the inventory service."""',
            "",
            "from __future__ import annotations",
            "",
            "import logging",
            "from decimal import Decimal",
            "",
            "from sqlalchemy import select",
            f"from inventory.db import models, {rng.choice(['queries', 'session'])}",
            "",
            'log = logging.getLogger("inventory")',
            "",
        ]
        size = sum(len(x) + 8 for x in lines)
        while size < target:
            name = self.ident()
            arg = rng.choice(_NOUNS)
            block = [
                "",
                f"def {name}({arg}_id: int, *, db: Session, strict: bool = True) -> "
                f"models.{arg.title()}:",
                f'    """{name.replace("_", " ").capitalize()} for one {arg}."""',
                f"    row = db.query(models.{arg.title()}).filter_by(id={arg}_id).first()",
                "    if row is None:",
                f'        raise LookupError(f"{arg} {{{arg}_id}} not found")',
                f"    if strict and row.quantity < {rng.randint(0, 50)}:",
                f'        log.warning("low %s for %s", "{rng.choice(_NOUNS)}", {arg}_id)',
                f"    row.updated_by = {rng.choice(['None', 'ctx.user', 'SYSTEM_USER'])}",
                f"    total = Decimal(row.price) * {rng.randint(1, 12)}",
                f"    return {rng.choice(['row', 'total', f'{self.ident()}(row, db=db)'])}",
            ]
            lines.extend(block)
            size += sum(len(x) + 8 for x in block)
        return "\n".join(f"{n:6d}\t{line}" for n, line in enumerate(lines, 1))

    def test_log(self, failures: int, big: bool = False) -> str:
        """pytest output with `failures` failures and their tracebacks."""
        rng = self.rng
        files = [m for m in _MODULES if m.startswith("tests/test_")]
        collected = rng.randint(180, 260)
        out = [
            "============================= test session starts ==============================",
            "platform linux -- Python 3.12.3, pytest-8.3.2, pluggy-1.5.0",
            f"rootdir: {_REPO}",
            "configfile: pyproject.toml",
            "plugins: anyio-4.4.0, cov-5.0.0",
            f"collected {collected} items",
            "",
        ]
        failed: list[tuple[str, str, str, str]] = []
        for path in files:
            dots = rng.randint(30, 70)
            marks = ["."] * dots
            for _ in range(rng.randint(0, failures)):
                if len(failed) >= failures:
                    break
                k = rng.randrange(dots)
                marks[k] = "F"
                err, msg = rng.choice(_ERRORS)
                failed.append((path, f"test_{self.ident()}", err, msg))
            out.append(
                f"{path} {''.join(marks)}{' ' * max(1, 72 - dots - len(path))}"
                f"[{rng.randint(10, 99)}%]"
            )
        if failed:
            out += [
                "",
                "=================================== FAILURES ===================================",
            ]
        for path, test, err, msg in failed:
            src = self.module(tests=False)
            out += [
                f"_{'_' * 20} {test} {'_' * 20}",
                "",
                "client = <FlaskClient <Flask 'inventory'>>, "
                f"db = <Session at 0x7f{rng.getrandbits(40):010x}>",
                "",
                f"    def {test}(client, db):",
                f"        {rng.choice(_NOUNS)} = factories.make_{rng.choice(_NOUNS)}"
                f"(db, quantity={rng.randint(0, 9)})",
                f'        resp = client.post("/api/{rng.choice(_NOUNS)}s", '
                f'json={{"sku": "SKU-{rng.randint(1000, 9999)}"}})',
                ">       assert resp.status_code == 200",
                f"E       {err}: {msg}",
                "",
                f"{path}:{rng.randint(20, 400)}: {err}",
                "----------------------------- Captured log call ------------------------------",
                f"ERROR    inventory:{src.rsplit('/', 1)[-1]}:{rng.randint(20, 300)} "
                f"{self.ident()} failed for id={rng.randint(1, 99999)}",
            ]
            if big:
                out += [
                    "Traceback (most recent call last):",
                    *[
                        f'  File "{_REPO}/{self.module(tests=False)}", '
                        f"line {rng.randint(10, 500)}, "
                        f"in {self.ident()}\n    return {self.ident()}(row, db=db)"
                        for _ in range(rng.randint(4, 9))
                    ],
                    f"{err}: {msg}",
                ]
        out += [
            "",
            "=========================== short test summary info ============================",
        ]
        out += [f"FAILED {p}::{t} - {e}: {m}" for p, t, e, m in failed]
        passed = collected - len(failed)
        state = f"{len(failed)} failed, {passed} passed" if failed else f"{passed} passed"
        out.append(
            f"======================= {state} in {rng.uniform(4, 40):.2f}s ======================="
        )
        return "\n".join(out)

    def grep(self, pattern: str) -> str:
        rng = self.rng
        hits = [
            f"{self.module()}:{rng.randint(1, 420)}:    "
            f"{rng.choice(['row = ', 'return ', 'total += ', ''])}{pattern}"
            f"({rng.choice(_NOUNS)}_id{rng.choice(['', ', db=db', ', strict=False'])})"
            for _ in range(rng.randint(4, 40))
        ]
        return "\n".join(sorted(hits))

    def listing(self, folder: str) -> str:
        rng = self.rng
        lines = [f"total {rng.randint(40, 400)}"]
        names = sorted({m.split("/")[-1] for m in _MODULES} | {"__pycache__", "README.md"})
        for name in rng.sample(names, k=min(len(names), rng.randint(6, 14))):
            kind = "d" if "." not in name else "-"
            lines.append(
                f"{kind}rw-r--r-- 1 dev dev {rng.randint(96, 48000):6d} "
                f"Nov {rng.randint(1, 30):2d} "
                f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} {name}"
            )
        return f"{folder}:\n" + "\n".join(lines)

    def app_log(self, lines: int) -> str:
        """A long service log (the kind of output that floods a context window)."""
        rng = self.rng
        levels = ("INFO", "INFO", "INFO", "DEBUG", "WARNING", "ERROR")
        out = []
        for k in range(lines):
            level = rng.choice(levels)
            out.append(
                f"2026-11-{rng.randint(1, 28):02d}T"
                f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:"
                f"{rng.randint(0, 59):02d}.{rng.randint(0, 999):03d}Z {level:<7} "
                f"inventory.{rng.choice(['api', 'db', 'worker', 'pricing'])} "
                f"req={rng.getrandbits(32):08x} {self.ident()} "
                f"{rng.choice(_NOUNS)}_id={rng.randint(1, 99999)} "
                f"took={rng.randint(1, 2500)}ms"
                + (f" error={rng.choice(_ERRORS)[0]}" if level == "ERROR" else "")
            )
            if k % 97 == 96:
                out.append(f"    ... {rng.randint(10, 400)} similar lines elided by logrotate ...")
        return "\n".join(out)

    def patch(self, path: str) -> str:
        """A new version of part of a file (a large tool input)."""
        body = self.source(path, 1200, 4200).splitlines()
        return "\n".join(line.split("\t", 1)[-1] for line in body).replace(
            "db.query(", "db.scalars(select("
        )


# ---------------------------------------------------------------------------------------------
# Agent steps
# ---------------------------------------------------------------------------------------------


def _call(w: _Writer, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": w.call_id(),
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def _assistant(thought: str, calls: Sequence[dict[str, Any]]) -> OpenAIMessage:
    return {"role": "assistant", "content": thought, "tool_calls": list(calls)}


def _result(call: dict[str, Any], output: str) -> OpenAIMessage:
    return {"role": "tool", "tool_call_id": call["id"], "content": output}


def _tool_output(w: _Writer, name: str, args: dict[str, Any], failures: int, *, task: bool) -> str:
    if name == "read_file":
        # The long task reads many smaller slices; the chat rounds dump whole files.
        return w.source(str(args["path"]), 1_200, 5_000 if task else 9_000)
    if name == "run_tests":
        return w.test_log(failures, big=w.rng.random() < 0.3)
    if name == "grep":
        return w.grep(str(args["pattern"]))
    if name == "list_dir":
        return w.listing(str(args["path"]))
    if name == "write_file":
        content = str(args["content"])
        digest = f"{w.rng.getrandbits(64):016x}"
        return f"wrote {len(content.encode())} bytes to {args['path']} (sha1 {digest})"
    if name == "tail_log":
        return w.app_log(int(args["lines"]))
    return f"$ {args.get('cmd', name)}\nexit status 0"


def _step(w: _Writer, failures: int, *, task: bool, burst: bool = False) -> list[OpenAIMessage]:
    """One ReAct step: a thought with one to three tool calls, then their results."""
    rng = w.rng
    calls: list[dict[str, Any]]
    if burst:
        # Production logs pulled in parallel: the current round floods at once.
        calls = [
            _call(w, "tail_log", {"service": svc, "lines": rng.randint(90, 120)})
            for svc in rng.sample(["api", "worker", "scheduler"], k=2)
        ]
        thought = "The failures look load-dependent; pulling the service logs from both hosts."
    else:
        roll = rng.random()
        if roll < 0.25:
            paths = rng.sample(_MODULES, k=rng.choice((2, 2, 3)))
            calls = [_call(w, "read_file", {"path": p}) for p in paths]
            thought = f"Reading {', '.join(paths)} side by side."
        elif roll < 0.45:
            path = w.module(tests=False)
            calls = [_call(w, "read_file", {"path": path})]
            thought = f"Let me look at {path}."
        elif roll < 0.6:
            pattern = rng.choice(["db.query", w.ident(), "filter_by", "lookup_sku"])
            calls = [_call(w, "grep", {"pattern": pattern, "path": "src/"})]
            if rng.random() < 0.5:
                calls.append(
                    _call(w, "list_dir", {"path": rng.choice(["src/inventory/api", "tests"])})
                )
            thought = f"Searching for {pattern!r}."
        elif roll < 0.8 or not task:
            target = rng.choice(["tests/", w.module(tests=True)])
            calls = [
                _call(
                    w,
                    "run_tests",
                    {"target": target, "args": ["-x", "-q"] if rng.random() < 0.3 else ["-q"]},
                )
            ]
            thought = f"Running the tests in {target}."
        else:
            path = w.module(tests=False)
            calls = [_call(w, "write_file", {"path": path, "content": w.patch(path)})]
            thought = f"Rewriting the queries of {path} with select()."
    msgs: list[OpenAIMessage] = [_assistant(thought, calls)]
    for call in calls:
        fn = call["function"]
        msgs.append(
            _result(
                call, _tool_output(w, fn["name"], json.loads(fn["arguments"]), failures, task=task)
            )
        )
    return msgs


def _final_answer(w: _Writer, request: str) -> OpenAIMessage:
    rng = w.rng
    path = w.module(tests=False)
    err, msg = rng.choice(_ERRORS)
    text = (
        f"Done. The cause was in `{path}`: `{w.ident()}()` raised `{err}: {msg}` when "
        f"{rng.choice(_NOUNS)}_id={rng.randint(1, 99999)} had no row. I changed it to return early "
        f"with a 404, added `tests/test_{rng.choice(_NOUNS)}.py::test_{w.ident()}`, and the suite "
        f"now passes ({rng.randint(180, 260)} passed in {rng.uniform(5, 30):.1f}s). "
        f"Request was: {request[:60]}"
    )
    return {"role": "assistant", "content": text}


def _pasted_log(w: _Writer) -> str:
    """A user who pastes a CI log into the chat (a large user message)."""
    return (
        "Here is the CI output from last night, for context:\n\n"
        + w.test_log(failures=3, big=True)
        + "\n\n"
        + w.app_log(60)
    )


def generate(
    rounds: int = DEFAULT_ROUNDS, steps: int = DEFAULT_STEPS, seed: int = DEFAULT_SEED
) -> Iterator[DemoStep]:
    """The demo session, one `add()` at a time.

    `rounds` user rounds of 3 to 9 tool steps each, then a long task of `steps` tool steps
    (0 for none) that ends with a final answer.
    """
    if rounds < 0 or steps < 0:
        raise ValueError(f"rounds and steps must be >= 0, got rounds={rounds}, steps={steps}")
    rng = random.Random(seed)
    w = _Writer(rng)
    system = (
        "You are a senior software engineer working in the repository "
        f"{_REPO} (a Python inventory service: Flask API, SQLAlchemy models, pytest). Use the "
        "tools read_file, write_file, grep, list_dir, run_tests and tail_log; think before each "
        "call, make independent calls in parallel, and finish every request with a short, "
        "factual answer.\n\n" + RELOAD_SNIPPET
    )
    yield DemoStep("setup", [{"role": "system", "content": system}], is_step=False)
    requests = list(_REQUESTS)
    rng.shuffle(requests)
    for r in range(rounds):
        request = requests[r % len(requests)]
        content = _pasted_log(w) + "\n\n" + request if r % 3 == 1 else request
        phase = f"round {r + 1}"
        yield DemoStep(phase, [{"role": "user", "content": content}], is_step=False)
        # Every third round is a quick one: too short for a tool-run summary, so its large
        # outputs are left to the previews.
        n = rng.randint(2, 3) if r % 3 == 2 else rng.randint(4, 9)
        for k in range(n):
            yield DemoStep(phase, _step(w, failures=max(0, 2 - k // 2), task=False))
        yield DemoStep(phase, [_final_answer(w, request)])
    if steps == 0:
        return
    yield DemoStep("task", [{"role": "user", "content": _TASK}], is_step=False)
    # Bursts of big logs land in the protected tail of the current round, where only S5 helps.
    bursts = {int(steps * f) for f in (0.35, 0.7)} if steps >= 20 else set()
    for k in range(steps - 1):
        failures = 3 if k < steps // 3 else (1 if k < 2 * steps // 3 else 0)
        yield DemoStep("task", _step(w, failures, task=True, burst=k in bursts))
    yield DemoStep(
        "task",
        [
            {
                "role": "assistant",
                "content": (
                    f"Migration finished: {len(_MODULES) - 4} modules now use select(); the "
                    f"legacy helpers in src/inventory/db/queries.py are deprecated and unused. "
                    f"All {rng.randint(200, 260)} tests pass. Left: the reindex worker still "
                    "builds raw SQL for its COPY statement, which select() cannot express."
                ),
            }
        ],
    )


# ---------------------------------------------------------------------------------------------
# Running it
# ---------------------------------------------------------------------------------------------


class DemoMemory(Protocol):
    """What `run` needs of a memory (an `AutoContextMemory` fits)."""

    def add(self, messages: list[OpenAIMessage]) -> Sequence[Msg]: ...

    def needs_compression(self) -> bool: ...

    def compress_if_needed(self) -> list[Event]: ...


@dataclass
class DemoResult:
    #: Every message added, as given (OpenAI format), by the id the memory gave it: what a
    #: reload must give back.
    originals: dict[int, OpenAIMessage] = field(default_factory=dict)
    tokens_added: int = 0
    #: Agent steps fed (calls of `add`).
    steps: int = 0
    #: Per compression call (the trigger held after the step), the working (messages, tokens)
    #: its last event left, or None when it changed nothing.
    fired: list[tuple[int, int] | None] = field(default_factory=list)


def run(
    memory: DemoMemory,
    stream: Iterator[DemoStep],
    *,
    on_step: Callable[[DemoStep], None] | None = None,
    on_event: Callable[[Event], None] | None = None,
) -> DemoResult:
    """Feed `stream` into `memory`, compressing after every add; report as it goes."""
    result = DemoResult()
    for step in stream:
        stored = memory.add(step.messages)
        for given, msg in zip(step.messages, stored, strict=True):
            if msg.id is not None:
                result.originals[msg.id] = given
            result.tokens_added += msg.tokens or 0
        result.steps += 1
        events: list[Event] = []
        if memory.needs_compression():
            events = memory.compress_if_needed()
            result.fired.append(
                (events[-1].messages_after, events[-1].tokens_after) if events else None
            )
        for event in events:
            if on_event is not None:
                on_event(event)
        if on_step is not None:
            on_step(step)
    return result
