"""Property test of the bound (docs/design.md §2, "The bound"; section 3, the fold).

After every `compress_if_needed()` the working context is under `max_tokens`, on random workloads
of many shapes (chats of small rounds, tool chats, long single tasks, many tasks in one session,
pinned groups, pasted logs, large tool outputs), with random valid configs and three summarizers:
the offline one, one that answers exactly at the budget the request states, and one that fails
on every call (then the fold or S6 must fall back to the offline summarizer, recorded as such).
The one exception, protected messages alone over the window, has a test of its own.

The strict property runs on the in-memory store of the compression contract
(tests/memory_store.py), many examples in milliseconds each, and on PostgreSQL through
`AutoContextMemory` with a few examples (marked `postgresql`), so that the SQL store is held to
the same contract. Run it alone with `-k test_bound_holds_on_random_workloads`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from autoctx import (
    AutoContextConfig,
    AutoContextMemory,
    Event,
    Msg,
    OfflineSummarizer,
    Summarizer,
    SummarizerError,
    SummaryRequest,
    SummaryResult,
    ToolUseBlock,
)
from autoctx._intake import count_tokens
from autoctx._tags import neutralize_tags
from autoctx._tokens import TokenCounter
from tests.invariants import (
    assert_every_original_reachable,
    assert_totals_match,
    assert_valid_openai_chat,
    originals,
)
from tests.memory_store import MemorySession, PostgresSession, PropertySession

#: Applied events per strategy over all examples of the strict property, checked at the end.
EXERCISED: Counter[int] = Counter()
#: Applied fallback events (the offline summarizer standing in for a failed one), per strategy.
FALLBACKS: Counter[int] = Counter()
#: Examples on the in-memory store (milliseconds each) and on PostgreSQL (a replayed session
#: each); AUTOCTX_PROPERTY_EXAMPLES sets both.
EXAMPLES = int(os.environ.get("AUTOCTX_PROPERTY_EXAMPLES", "200"))
PG_EXAMPLES = int(os.environ.get("AUTOCTX_PROPERTY_EXAMPLES", "5"))
NO_SHRINK = tuple(p for p in Phase if p not in (Phase.shrink, Phase.explain))

#: Strategies whose text an LLM writes: under the failing summarizer, any applied one of these
#: can only be the offline fallback.
LLM_WRITTEN = frozenset({1, 4, 5, 6, 7})
#: The model the offline fallback is recorded under (docs/design.md §2).
FALLBACK_MODEL = "offline"
#: In the strict property, system messages, pinned groups and the largest user message together
#: stay under this share of the window, so the exception can never apply.
PROTECTED_SHARE = 0.4
#: The share of the window system messages and pinned groups may take (the rest of the protected
#: share is for the largest user message).
FIXED_SHARE = 0.3
#: Characters per token a budget stated in tokens is turned into (what a model roughly writes).
CHARS_PER_TOKEN = 3

COUNTER = TokenCounter(AutoContextConfig().model)

# -- summarizers ----------------------------------------------------------------------------


class AtBudgetSummarizer:
    """A verbose model: its answer is as long as the request allows, never shorter.

    The budget is `char_budget` when set, else the optional `token_budget` (tokens, about
    `CHARS_PER_TOKEN` characters each), else half the input (a request with no budget still
    gets a long answer, which the core must survive: it may be `no_gain`).
    """

    def __init__(self) -> None:
        self.calls = 0

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        limits: list[int] = []
        if request.char_budget is not None:
            limits.append(request.char_budget)
        token_budget: int | None = request.token_budget
        if token_budget is not None:
            limits.append(token_budget * CHARS_PER_TOKEN)
        size = max(1, min(limits) if limits else request.input_chars // 2)
        # The transcript's own words (tags neutralized: an answer with a tag is refused),
        # repeated if the budget is larger than the transcript.
        body = neutralize_tags(request.transcript).strip() or "nothing happened"
        text = (body + "\n") * (size // (len(body) + 1) + 1)
        return SummaryResult(text=text[:size].rstrip() or "x", model="at-budget")


class FailingSummarizer:
    """An endpoint that is down: every call raises, as a 503 would."""

    def __init__(self) -> None:
        self.calls = 0

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        raise SummarizerError("http_error", "503")


SummarizerName = Literal["offline", "at_budget", "failing"]


def make_summarizer(name: SummarizerName) -> Summarizer:
    if name == "offline":
        return OfflineSummarizer()
    if name == "at_budget":
        return AtBudgetSummarizer()
    return FailingSummarizer()


# -- workloads ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """One assistant message with `width` calls (parallel when > 1) and their results."""

    width: int
    output_chars: int
    pinned: bool


@dataclass(frozen=True)
class Task:
    """A user message, its tool groups and maybe a final answer (a round)."""

    question_chars: int
    groups: tuple[Group, ...]
    answer_chars: int | None  # None: no final answer (an unfinished or abandoned task)
    system: bool = False  # a system message of its own before the user message
    log: bool = False  # the question is a pasted log


@dataclass(frozen=True)
class Workload:
    shape: str
    window: int
    tasks: tuple[Task, ...]

    def describe(self, batches: Sequence[Sequence[Msg]]) -> str:
        """What a failure message shows of the workload (`batches`: its rendering, which has
        the real size of a log cut to fit the window)."""
        groups = [g for t in self.tasks for g in t.groups]
        largest = max(len(b[0].text) for b in batches if b[0].role == "user")
        return (
            f"{self.shape} workload: {len(self.tasks)} task(s), {len(groups)} tool group(s) "
            f"({sum(g.width > 1 for g in groups)} parallel, {sum(g.pinned for g in groups)} "
            f"pinned, {sum(g.output_chars > 5120 for g in groups)} with outputs > 5120 chars), "
            f"{sum(t.system for t in self.tasks)} system message(s), "
            f"{sum(t.answer_chars is not None for t in self.tasks)} answered, largest user "
            f"message {largest:,} chars"
            f"{' (pasted log)' if any(t.log for t in self.tasks) else ''}"
        )


def filler(chars: int, seed: int, what: str) -> str:
    """Varied text with facts in it (paths, ids, values), so summarizers have work to do."""
    out: list[str] = []
    n = 0
    i = 0
    while n < chars:
        line = (
            f"{what} {seed}.{i}: read /srv/app/mod_{seed}_{i}.py status=200 "
            f"id={(seed * 7919 + i * 104729) % 16**8:08x} rows={i * 37 % 1000}\n"
        )
        out.append(line)
        n += len(line)
        i += 1
    return "".join(out)[:chars]


def pasted_log(max_tokens: int, max_chars: int, seed: int) -> str:
    """A pasted log of at most `max_chars` characters and `max_tokens` tokens."""
    lines: list[str] = []
    chars = tokens = 0
    for i in range(100_000):
        level = "ERROR" if i % 17 == 5 else "INFO"
        line = (
            f"2024-05-01T12:{i // 60 % 60:02d}:{i % 60:02d} {level} worker-{(seed + i) % 8} "
            f"job={seed * 1000 + i} took {(i * 37) % 900}ms\n"
        )
        t = COUNTER.count(line)
        if chars + len(line) > max_chars or tokens + t > max_tokens:
            break
        lines.append(line)
        chars += len(line)
        tokens += t
    return "paste of the failing run:\n" + "".join(lines)


def render(workload: Workload) -> list[list[Msg]]:
    """The workload as `add()` batches: one message, or one whole tool group, per batch."""
    batches: list[list[Msg]] = []
    n = 0
    for t, task in enumerate(workload.tasks):
        if task.system:
            batches.append([Msg.system(f"You are agent {t}. " + filler(120, t, "rule"))])
        if task.log:
            question = pasted_log(_log_token_allowance(workload), task.question_chars, seed=t)
        else:
            question = f"task {t}: " + filler(task.question_chars, t, "ask")
        batches.append([Msg.user(question)])
        for g in task.groups:
            calls = [
                ToolUseBlock(f"call_{n + k}", "read_file", json.dumps({"path": f"f{n + k}.py"}))
                for k in range(g.width)
            ]
            batch = [Msg.assistant(None, calls, pinned=g.pinned)]
            batch += [
                Msg.tool(c.id, filler(g.output_chars, n + k, "out"), "read_file")
                for k, c in enumerate(calls)
            ]
            n += g.width
            batches.append(batch)
        if task.answer_chars is not None:
            batches.append([Msg.assistant(f"answer {t}: " + filler(task.answer_chars, t, "fact"))])
    return batches


def _fixed_protected_tokens(workload: Workload) -> int:
    """Tokens of the system messages and pinned groups (the protected part besides the current
    user message), counted on the rendered messages without the logs."""
    plain = dataclasses.replace(
        workload, tasks=tuple(dataclasses.replace(t, log=False) for t in workload.tasks)
    )
    total = 0
    for batch in render(plain):
        if batch[0].role == "system" or batch[0].pinned:
            total += sum(count_tokens(m, COUNTER) for m in batch)
    return total


def _log_token_allowance(workload: Workload) -> int:
    # The log is the largest user message; with the system messages and pinned groups it stays
    # under PROTECTED_SHARE of the window (a margin of 5% for line-by-line counting).
    room = int(PROTECTED_SHARE * workload.window * 0.95) - _fixed_protected_tokens(workload)
    return max(50, room)


def protected_tokens(batches: Sequence[Sequence[Msg]]) -> int:
    """An upper bound of what the design protects at any time: every system message, every pinned
    group, and the largest user message (any one may be the current one, before S5 shortens
    it). Groups are added whole, so there is never a trailing pending call."""
    fixed = sum(
        count_tokens(m, COUNTER)
        for batch in batches
        if batch[0].role == "system" or batch[0].pinned
        for m in batch
    )
    users = [count_tokens(b[0], COUNTER) for b in batches if b[0].role == "user"]
    return fixed + max(users, default=0)


def groups(
    n: tuple[int, int], width: int, outputs: st.SearchStrategy[int]
) -> st.SearchStrategy[tuple[Group, ...]]:
    # Pinned groups are rare and small, so the protected part stays a small share of the window.
    group = st.builds(
        Group,
        st.integers(1, width),
        outputs,
        st.integers(0, 9).map(lambda k: k == 0),
    ).map(
        lambda g: dataclasses.replace(g, output_chars=min(g.output_chars, 300)) if g.pinned else g
    )
    return st.lists(group, min_size=n[0], max_size=n[1]).map(tuple)


def unpin_to_fit(workload: Workload) -> Workload:
    """Unpin the latest pinned groups until system messages and pinned groups hold at most
    `FIXED_SHARE` of the window, leaving room for the largest user message in the protected
    share (many tasks with several pinned groups could otherwise exceed it on a small window)."""
    while _fixed_protected_tokens(workload) > FIXED_SHARE * workload.window:
        tasks = list(workload.tasks)
        t = max(i for i, task in enumerate(tasks) if any(g.pinned for g in task.groups))
        gs = list(tasks[t].groups)
        k = max(i for i, g in enumerate(gs) if g.pinned)
        gs[k] = dataclasses.replace(gs[k], pinned=False)
        tasks[t] = dataclasses.replace(tasks[t], groups=tuple(gs))
        workload = dataclasses.replace(workload, tasks=tuple(tasks))
    return workload


def scaled(window: int, lo: float, hi: float) -> st.SearchStrategy[int]:
    """Characters as a share of the window (about 3-4 characters a token), so that a workload
    of a few dozen adds fills any window and the check stays fast."""
    return st.integers(max(1, int(lo * window)), max(2, int(hi * window)))


# Outputs over `large_payload_chars` (5120), absolute: the previews and S5 are about those.
large_outputs = st.integers(5121, 16_000)


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    window = draw(st.integers(4_000, 40_000))
    shape = draw(st.sampled_from(["chat", "tools", "long_task", "many_tasks"]))
    small = scaled(window, 0.01, 0.08)
    medium = scaled(window, 0.05, 0.4)
    outputs = st.one_of(small, medium, large_outputs)
    tasks: list[Task]
    if shape == "chat":
        # Many small rounds: user + answer, now and then a small tool call between.
        rounds = st.builds(
            Task, small, groups((0, 1), 1, small), medium, st.just(False), st.just(False)
        )
        tasks = draw(st.lists(rounds, min_size=5, max_size=20))
    elif shape == "tools":
        rounds = st.builds(
            Task, small, groups((1, 3), 3, outputs), medium, st.just(False), st.just(False)
        )
        tasks = draw(st.lists(rounds, min_size=1, max_size=6))
    elif shape == "long_task":
        # One request, many tool steps, no answer yet.
        tasks = [Task(draw(small), draw(groups((8, 40), 2, outputs)), None)]
    else:
        # Many tasks, each with its own system message, most without a final answer.
        task = st.builds(
            Task,
            small,
            groups((1, 4), 3, outputs),
            st.one_of(st.none(), st.none(), st.none(), medium),
            st.just(True),
            st.just(False),
        )
        tasks = draw(st.lists(task, min_size=3, max_size=10))
    workload = unpin_to_fit(Workload(shape, window, tuple(tasks)))
    tasks = list(workload.tasks)
    if draw(st.integers(0, 3)) == 0:
        # A pasted log (10-40 KB, or what the window allows) in the latest user message.
        last = tasks[-1]
        tasks[-1] = dataclasses.replace(
            last, question_chars=draw(st.integers(10_000, 40_000)), log=True
        )
    return Workload(shape, window, tuple(tasks))


@st.composite
def configs(draw: st.DrawFn, window: int) -> AutoContextConfig:
    """Valid configs for `window`: often the defaults (which follow the window), sometimes with
    other fields set."""
    fields: dict[str, object] = {"max_tokens": window}
    token_ratio = 0.75
    if draw(st.booleans()):
        token_ratio = draw(st.floats(0.5, 0.9))
        fields["token_ratio"] = token_ratio
        fields["target_ratio"] = draw(st.floats(0.2, token_ratio - 0.05))
    target = int(window * float(fields.get("target_ratio", 0.6)))  # type: ignore[arg-type]
    if draw(st.booleans()):
        fields["msg_threshold"] = draw(st.integers(8, 200))
    if draw(st.booleans()):
        fields["last_keep"] = draw(st.integers(0, 60))
    if draw(st.booleans()):
        fields["min_tool_run"] = draw(st.integers(0, 30))
    if draw(st.booleans()):
        fields["min_compress_tokens"] = draw(st.integers(0, max(1, target // 2)))
    if draw(st.booleans()):
        fields["fold_keep_tokens"] = draw(st.integers(0, max(1, target // 3)))
    if draw(st.booleans()):
        fields["fold_budget_tokens"] = draw(
            st.integers(min(200, target // 5), max(200, target // 5))
        )
    return AutoContextConfig(**fields)  # type: ignore[arg-type]


@st.composite
def cases(draw: st.DrawFn) -> tuple[Workload, AutoContextConfig, SummarizerName]:
    workload = draw(workloads())
    config = draw(configs(workload.window))
    name: SummarizerName = draw(st.sampled_from(["offline", "at_budget", "failing"]))
    return workload, config, name


# -- checks ---------------------------------------------------------------------------------


def describe_events(events: Sequence[Event]) -> str:
    return (
        "; ".join(
            f"S{e.strategy} {e.status} {e.tokens_before}->{e.tokens_after}"
            + (f" reason={e.reason}" if e.reason else "")
            + (f" model={e.model}" if e.model else "")
            + (f" error={e.error}" if e.error else "")
            for e in events
        )
        or "no events"
    )


def is_over_window_report(event: Event) -> bool:
    return (
        event.status == "skipped"
        and event.strategy == 7
        and (event.error or "").startswith("over_window")
    )


def check_call(
    session: PropertySession,
    events: Sequence[Event],
    *,
    where: str,
    tokens_at_start: int,
    failing: bool,
) -> None:
    """The properties that hold after every `compress_if_needed()` of the strict property."""
    window = session.config.max_tokens
    tokens = session.token_count()
    assert tokens < window, (
        f"the bound is broken: {where}: working tokens {tokens:,} >= max_tokens {window:,} "
        f"(the call started at {tokens_at_start:,}); events of the call: "
        f"{describe_events(events)}"
    )
    # The protected part is well inside the window: reporting it over the window would be false.
    reports = [e for e in events if is_over_window_report(e)]
    assert not reports, f"{where}: over_window reported with protected < 40% of the window"
    if failing:
        applied = [e for e in events if e.status == "applied"]
        for e in applied:
            if e.strategy in LLM_WRITTEN:
                # The summarizer never answered, so any LLM-written summary is the fallback's.
                assert e.reason == "fallback" and e.model == FALLBACK_MODEL, (
                    f"{where}: S{e.strategy} applied with a failing summarizer but not recorded "
                    f"as the offline fallback: {describe_events([e])}"
                )
        # Where the rungs that need no LLM (previews) left the context over the window, only
        # a fallback can have brought it under.
        plain = [e for e in applied if e.reason != "fallback"]
        left = plain[-1].tokens_after if plain else tokens_at_start
        if left >= window:
            assert any(e.reason == "fallback" for e in applied), (
                f"{where}: the summarizer failed and the context was at {left:,} >= {window:,} "
                f"after the non-LLM rungs, but no fallback event: {describe_events(events)}"
            )
    session.check()


# -- the properties -------------------------------------------------------------------------


def _examples(examples: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A test run over `examples` random cases.

    derandomize: CI runs the same examples every time; raise AUTOCTX_PROPERTY_EXAMPLES to
    explore. Shrinking is off unless AUTOCTX_PROPERTY_SHRINK is set: on PostgreSQL every
    attempt replays a whole session, so shrinking one failure takes Hypothesis's full five
    minutes; the failure message already names the workload's shape, the tokens and the window.
    """

    def wrap(test: Callable[..., None]) -> Callable[..., None]:
        return settings(
            max_examples=examples,
            deadline=None,
            derandomize=not os.environ.get("AUTOCTX_PROPERTY_RANDOM"),
            phases=tuple(Phase) if os.environ.get("AUTOCTX_PROPERTY_SHRINK") else NO_SHRINK,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )(given(case=cases())(test))

    return wrap


def bound_holds(
    open_session: Callable[[AutoContextConfig, Summarizer], PropertySession],
    case: tuple[Workload, AutoContextConfig, SummarizerName],
) -> None:
    workload, config, name = case
    batches = render(workload)
    protected = protected_tokens(batches)
    # A precondition of this strict property (a bug of the generator if it fails): the
    # exception of docs/design.md cannot apply.
    shape = workload.describe(batches)
    assert protected <= PROTECTED_SHARE * workload.window, (shape, protected)
    session = open_session(config, make_summarizer(name))
    added: list[Msg] = []
    for i, batch in enumerate(batches):
        added.extend(session.add(batch))
        before = session.token_count()
        events = session.compress()
        where = (
            f"{shape}; protected <= {protected:,} tokens; summarizer {name}; "
            f"after add {i + 1}/{len(batches)} ({batch[0].role}"
            f"{' tool group' if batch[0].tool_uses else ''})"
        )
        check_call(session, events, where=where, tokens_at_start=before, failing=name == "failing")
        for e in events:
            if e.status == "applied":
                EXERCISED[e.strategy] += 1
                if e.reason == "fallback":
                    FALLBACKS[e.strategy] += 1
    stored = session.originals()
    assert [m.id for m in stored] == [m.id for m in added]
    assert [m.content for m in stored] == [m.content for m in added]
    session.close()


@_examples(EXAMPLES)
def test_bound_holds_on_random_workloads(
    case: tuple[Workload, AutoContextConfig, SummarizerName],
) -> None:
    bound_holds(MemorySession, case)


@pytest.mark.postgresql
@_examples(PG_EXAMPLES)
def test_bound_holds_on_random_workloads_on_postgresql(
    db_url: str, case: tuple[Workload, AutoContextConfig, SummarizerName]
) -> None:
    bound_holds(lambda config, summarizer: PostgresSession(db_url, config, summarizer), case)


#: A case the random workloads found (2026-12-07), kept here so that it runs whatever examples
#: Hypothesis draws: a long task whose latest step is pinned, with unpinned steps between it and
#: an earlier pinned step, and the summarizer failing. S6's range began after the last pinned
#: message of the round, inside the latest step, so the stretch before it could never be
#: summarized: the working set ended at 4,877 tokens against a window of 4,868, and the fold
#: reported `over_window` although the protected messages hold only 1,836.
_PINNED_SPAN_CASE = (
    Workload(
        shape="long_task",
        window=4868,
        tasks=(
            Task(
                question_chars=14311,
                groups=tuple(
                    Group(width=w, output_chars=c, pinned=p)
                    for w, c, p in (
                        (1, 9347, False),
                        (1, 6269, False),
                        (2, 300, True),
                        (1, 414, False),
                        (1, 940, False),
                        (2, 281, False),
                        (2, 6415, False),
                        (1, 255, False),
                        (2, 521, False),
                        (1, 1499, False),
                        (2, 148, False),
                        (1, 890, False),
                        (2, 383, False),
                        (1, 67, True),
                        (2, 157, False),
                    )
                ),
                answer_chars=None,
                system=False,
                log=True,
            ),
        ),
    ),
    AutoContextConfig(
        msg_threshold=37,
        max_tokens=4868,
        reserve_tokens=0,
        target_ratio=0.4,
        large_payload_chars=5120,
        preview_chars=200,
        last_keep=38,
        min_tool_run=26,
        min_compress_tokens=84,
        current_round_ratio=0.3,
        fold_keep_tokens=271,
        fold_budget_tokens=194,
        fact_index_ratio=0.15,
    ),
    "failing",
)


def test_the_bound_holds_on_a_failing_summarizers_pinned_span() -> None:
    bound_holds(MemorySession, _PINNED_SPAN_CASE)


def test_system_messages_over_the_window_are_reported(db_url: str) -> None:
    """The exception: system messages alone exceed the window. The call says so (a skipped
    strategy-7 event, error `over_window...`), nothing crashes and nothing is lost."""
    config = AutoContextConfig(max_tokens=4_000)
    mem = AutoContextMemory.open(
        f"over-{uuid.uuid4().hex}", db_url, config, summarizer=OfflineSummarizer()
    )
    added = mem.add([Msg.system(f"rules {k}: " + filler(6_000, k, "rule")) for k in range(3)])
    system_tokens = sum(m.tokens or 0 for m in added)
    assert system_tokens > config.max_tokens  # the premise of the exception
    added += mem.add(Msg.user("task: " + filler(2_000, 9, "ask")))
    added += mem.add(
        Msg.assistant(None, [ToolUseBlock("call_0", "read_file", json.dumps({"path": "a.py"}))])
    )
    added += mem.add(Msg.tool("call_0", filler(8_000, 10, "out"), "read_file"))
    events = mem.compress_if_needed()
    assert any(is_over_window_report(e) for e in events), (
        f"system messages alone hold {system_tokens:,} tokens > max_tokens {config.max_tokens:,} "
        f"but the call did not report over_window: {describe_events(events)}"
    )
    # Everything else was compressed: what is left over the system messages is small.
    assert mem.refresh().token_count - system_tokens < config.max_tokens
    assert_valid_openai_chat(mem.to_openai())
    assert_every_original_reachable(mem)
    assert_totals_match(mem)
    assert [m.content for m in originals(mem)] == [m.content for m in added]
    mem.delete()


def test_the_random_workloads_exercise_the_fold() -> None:
    """Guards the generator: a bound that holds on workloads that never reach the fold (or
    never need the fallback) would prove little.

    The tally is filled by the in-memory property in this process. When that ran in another
    one (pytest-xdist's `--dist load` splits this file's tests across workers), the guard runs
    the property's examples itself: derandomized, they are the same examples."""
    if not EXERCISED:
        test_bound_holds_on_random_workloads()
    print("applied events per strategy:", dict(sorted(EXERCISED.items())))
    print("fallback events per strategy:", dict(sorted(FALLBACKS.items())))
    assert EXERCISED, "no example compressed at all"
    assert EXERCISED[7] > 0, EXERCISED
    assert FALLBACKS, "the failing summarizer never led to an offline fallback"
