"""The audit views of migration 0002 and the queries of docs/audit.md, on real compressions.

One module-wide population: a multi-round chat with tool groups and large outputs (one of its
summaries discarded for no gain), a long single-task run, a session whose summarizer never
answers, a session where two memories compress at once (a real conflict), and a session that
never compresses. Every view is checked against what
the public API says happened (events, reload, the working context), not against the SQL that the
views themselves run.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from autoctx import (
    AutoContextConfig,
    AutoContextMemory,
    Event,
    Msg,
    OfflineSummarizer,
    SummarizerError,
    SummaryRequest,
    SummaryResult,
    ToolUseBlock,
    UndoRefused,
)
from autoctx._store.database import (
    alembic_config,
    create_engine,
    current_revision,
    normalize_url,
    upgrade,
)
from autoctx._store.rows import event_row
from autoctx._store.tables import compression_events
from autoctx._summarizers import OFFLINE_MODEL
from tests.dbsql import offload_of_summaries, sql
from tests.histories import NO_MASKING, long_task
from tests.invariants import AUDIT_VIEWS, FACT_VIEWS, LIFECYCLE_VIEWS

DOC = Path(__file__).resolve().parent.parent / "docs" / "audit.md"
WORDS = (
    *("read", "write", "config", "port", "8080", "status", "200", "error", "timeout", "path"),
    *("/srv/app/settings.yaml", "key", "user_id=42", "retry", "service", "started", "stopped"),
    *("ok", "failed", "build", "test", "passed"),
)


# ---------------------------------------------------------------------------------------------
# Summarizers: real implementations of the protocol, as a caller would write them
# ---------------------------------------------------------------------------------------------


class CountingSummarizer:
    """The offline summarizer, reporting token usage the way an OpenAI endpoint does, so that
    the cost columns have figures to add up; keeps its own totals to compare with."""

    def __init__(self, model: str = "offline-counted", *, rambling_first: bool = False) -> None:
        self.inner = OfflineSummarizer()
        self.model = model
        #: The first answer is longer than what it summarizes: paid for, then discarded
        #: (a `failed` event with reason no_gain that still carries the usage).
        self.rambling_first = rambling_first
        self.calls = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        result = self.inner.summarize(request)
        if self.rambling_first and self.calls == 0:
            result = dataclasses.replace(result, text=result.text + " and so on" * 3000)
        prompt = (len(request.prompt) + len(request.transcript)) // 4 + 1
        completion = len(result.text) // 4 + 1
        self.calls += 1
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        return dataclasses.replace(
            result, model=self.model, prompt_tokens=prompt, completion_tokens=completion
        )


class FailingSummarizer:
    """An endpoint that never gives an answer: it times out, then rate-limits, then fails over
    HTTP, round and round (each error names its call, so events can be told apart)."""

    REASONS = ("timeout", "rate_limited", "http_error")

    def __init__(self) -> None:
        self.calls = 0

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        reason = self.REASONS[(self.calls - 1) % len(self.REASONS)]
        raise SummarizerError(reason, f"call {self.calls}: no answer from the endpoint")


class InterleavingSummarizer(CountingSummarizer):
    """Runs `meanwhile` during its first call: another compressor commits on the same session
    while this one waits for its summary, exactly the race docs/design.md §5 describes."""

    def __init__(self, meanwhile: Callable[[], object]) -> None:
        super().__init__()
        self.meanwhile: Callable[[], object] | None = meanwhile

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        if self.meanwhile is not None:
            run, self.meanwhile = self.meanwhile, None
            run()
        return super().summarize(request)


# ---------------------------------------------------------------------------------------------
# Generated histories
# ---------------------------------------------------------------------------------------------


class History:
    """Generates tool-using conversations with fresh call ids, deterministically."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.calls = 0

    def text(self, chars: int) -> str:
        words: list[str] = []
        size = 0
        while size < chars:
            word = self.rng.choice(WORDS)
            words.append(word)
            size += len(word) + 1
        return " ".join(words)

    def tool_group(self, output_chars: int, parallel: int = 1) -> list[Msg]:
        ids = []
        for _ in range(parallel):
            self.calls += 1
            ids.append(f"call_{self.calls}")
        calls = [
            ToolUseBlock(cid, "read_file", json.dumps({"path": f"/srv/app/file_{cid}.txt"}))
            for cid in ids
        ]
        results = [Msg.tool(cid, self.text(output_chars), "read_file") for cid in ids]
        return [Msg.assistant(None, calls), *results]

    def round(self, steps: int, large_every: int) -> list[Msg]:
        """A user request, `steps` tool groups (every `large_every`-th with a large output, one
        in three with two parallel calls) and a final answer."""
        out = [Msg.user("Please " + self.text(60))]
        for step in range(1, steps + 1):
            size = 1500 if step % large_every == 0 else 350
            out += self.tool_group(size, parallel=2 if step % 3 == 0 else 1)
        out.append(Msg.assistant("Done. " + self.text(150)))
        return out

    def task_step(self, step: int) -> list[Msg]:
        """One step of a long single task: a call and its (often large) output."""
        return self.tool_group(1500 if step % 2 == 0 else 300)


# ---------------------------------------------------------------------------------------------
# The population
# ---------------------------------------------------------------------------------------------


@dataclass
class Session:
    session_id: str
    tenant: str | None
    #: Every original added, by id, with its tokens.
    original_tokens: dict[int, int] = field(default_factory=dict)
    summarizer: CountingSummarizer | FailingSummarizer | None = None

    def add(self, mem: AutoContextMemory, msgs: list[Msg]) -> None:
        for m in mem.add(msgs):
            assert m.id is not None and m.tokens is not None
            self.original_tokens[m.id] = m.tokens


@dataclass
class Population:
    db_url: str
    chat: Session
    task: Session
    failing: Session
    conflict: Session
    quiet: Session
    #: A fork of the chat, with an erasure (not in `sessions`: its inherited events are the
    #: chat's, counted there).
    fork_id: str = ""

    @property
    def sessions(self) -> list[Session]:
        return [self.chat, self.task, self.failing, self.conflict, self.quiet]

    def memory(self, s: Session) -> AutoContextMemory:
        return AutoContextMemory.open(s.session_id, self.db_url, tenant=s.tenant, create=False)

    def sql(self, statement: str, **params: Any) -> list[sa.Row[Any]]:
        return sql(self.memory(self.chat), statement, **params)


def chat_config() -> AutoContextConfig:
    return AutoContextConfig(
        max_tokens=3000,
        msg_threshold=200,
        large_payload_chars=1000,
        preview_chars=100,
        reload_page_chars=500,
        last_keep=6,
        min_tool_run=2,
        min_compress_tokens=300,
    )


def task_config() -> AutoContextConfig:
    # Masking off: the task is there for S1, S5 and S6, which masking alone would leave no work.
    return dataclasses.replace(chat_config(), max_tokens=5000, last_keep=8, **NO_MASKING)


def run(mem: AutoContextMemory, s: Session, batches: Iterator[list[Msg]]) -> None:
    """Add each batch and compress when needed, as an agent loop does after every step."""
    for batch in batches:
        s.add(mem, batch)
        mem.compress_if_needed()


@pytest.fixture(scope="module")
def population(db_url: str) -> Population:
    tag = random.Random().getrandbits(32)
    pop = Population(
        db_url,
        chat=Session(
            f"audit-chat-{tag:x}", "acme", summarizer=CountingSummarizer(rambling_first=True)
        ),
        task=Session(f"audit-task-{tag:x}", "acme", summarizer=CountingSummarizer("offline-task")),
        failing=Session(f"audit-failing-{tag:x}", "beta", summarizer=FailingSummarizer()),
        conflict=Session(f"audit-conflict-{tag:x}", None),
        quiet=Session(f"audit-quiet-{tag:x}", None),
    )

    # A multi-round chat: the fold keeps its history in one rolling summary, summaries included.
    gen = History(1)
    chat = AutoContextMemory.open(
        pop.chat.session_id, db_url, chat_config(), tenant="acme", summarizer=pop.chat.summarizer
    )
    pop.chat.add(chat, [Msg.system("You are a careful operations agent.")])
    run(chat, pop.chat, (gen.round(4, large_every=3) for _ in range(12)))

    # One request followed by a long run of steps and no final answer yet.
    gen = History(2)
    task = AutoContextMemory.open(
        pop.task.session_id, db_url, task_config(), tenant="acme", summarizer=pop.task.summarizer
    )
    pop.task.add(task, [Msg.system("You are a build agent."), Msg.user("Build the release.")])
    run(task, pop.task, (gen.task_step(k) for k in range(1, 121)))

    # No summary ever comes back: failed events, while the previews (no LLM) still apply.
    gen = History(3)
    failing = AutoContextMemory.open(
        pop.failing.session_id,
        db_url,
        chat_config(),
        tenant="beta",
        summarizer=pop.failing.summarizer,
    )
    run(failing, pop.failing, (gen.round(4, large_every=2) for _ in range(6)))

    # Two memories on one session: the second commits while the first waits for its summary.
    gen = History(4)
    cfg = dataclasses.replace(chat_config(), max_tokens=100_000, msg_threshold=40)
    rival = AutoContextMemory.open(
        pop.conflict.session_id, db_url, cfg, summarizer=CountingSummarizer("offline-rival")
    )
    slow = InterleavingSummarizer(rival.compress_if_needed)
    pop.conflict.summarizer = slow
    first = AutoContextMemory.open(pop.conflict.session_id, db_url, cfg, summarizer=slow)
    for _ in range(5):
        pop.conflict.add(first, gen.round(4, large_every=99))
    first.compress_if_needed()

    quiet = AutoContextMemory.open(pop.quiet.session_id, db_url, chat_config())
    pop.quiet.add(quiet, [Msg.user("hello"), Msg.assistant("hi")])

    # A fork of the chat that then erases the chat's first user message in its own copy.
    pop.fork_id = f"audit-chat-fork-{tag:x}"
    child = chat.fork(pop.fork_id)
    early = child._store.load_messages(range(1, 20))
    first_user = min(i for i, m in early.items() if m.role == "user" and m.kind == "original")
    child.erase([first_user], reason="user request #1")
    # And takes back the newest compression it can: an undo for `autoctx_undos` (§7).
    for e in reversed([e for e in child.events() if e.status == "applied" and e.strategy]):
        try:
            child.undo(e.id, force=True)
        except UndoRefused:
            continue
        break
    else:
        raise AssertionError("the fork could undo none of its compressions")
    return pop


def events_of(pop: Population, s: Session) -> list[Event]:
    return pop.memory(s).events()


def applied(events: list[Event]) -> list[Event]:
    return [e for e in events if e.status == "applied"]


def test_the_population_exercises_every_outcome(population: Population) -> None:
    """The premises of the other tests: which strategies and statuses each session saw."""
    pop = population
    chat = events_of(pop, pop.chat)
    # The fold keeps the chat's history in one rolling summary, each fold taking the last.
    folds = [e for e in applied(chat) if e.strategy == 7]
    assert len(folds) >= 2
    assert any(folds[0].summary_message_id in e.replaced_ids for e in folds[1:])
    wasted = [e for e in chat if e.status == "failed"]
    # The rambling first answer is over the fold's budget: paid for, then discarded.
    assert len(wasted) == 1 and wasted[0].error and wasted[0].error.startswith("over_budget: ")
    assert wasted[0].prompt_tokens and wasted[0].model == "offline-counted"
    task = events_of(pop, pop.task)
    assert 1 in {e.strategy for e in applied(task)}
    assert {e.strategy for e in applied(task)} & {5, 6}
    failing = events_of(pop, pop.failing)
    assert any(e.status == "failed" for e in failing)
    assert applied(failing), "the previews need no LLM and still apply"
    conflict = events_of(pop, pop.conflict)
    assert any(e.status == "conflict" for e in conflict)
    assert applied(conflict), "the rival's compression committed"
    assert events_of(pop, pop.quiet) == []


# ---------------------------------------------------------------------------------------------
# autoctx_savings_by_strategy
# ---------------------------------------------------------------------------------------------


def test_every_writer_of_events_builds_its_row_with_the_same_columns() -> None:
    """One builder for the rows of `compression_events` (an apply, a recorded attempt, a pop,
    a clear, a fork and an erasure all call it): it names every column the audit reads, and
    only the database fills the rest (the time, and the mark of a fork's inherited copies)."""
    row = event_row(
        "s",
        7,
        strategy=0,
        status="applied",
        reason="clear",
        messages=(3, 0),
        tokens=(90, 0),
        replaced_ids=(4, 5, 6),
        replaced_tokens=90,
        session_version=12,
        config={"max_tokens": 1000},
    )
    assert set(row) == {c.name for c in compression_events.c} - {"created_at", "inherited"}
    totals = ("messages_before", "messages_after", "tokens_before", "tokens_after")
    assert tuple(row[k] for k in totals) == (3, 0, 90, 0)
    assert (row["id"], row["replaced_ids"], row["session_version"]) == (7, [4, 5, 6], 12)
    assert row["error"] is None and row["note"] is None


def test_savings_by_strategy_adds_up_the_events(population: Population) -> None:
    pop = population
    for s in pop.sessions:
        events = events_of(pop, s)
        rows = pop.sql(
            "SELECT * FROM autoctx_savings_by_strategy WHERE session_id = :s ORDER BY strategy",
            s=s.session_id,
        )
        assert [r.strategy for r in rows] == sorted({e.strategy for e in events})
        for r in rows:
            mine = [e for e in events if e.strategy == r.strategy]
            done = applied(mine)
            assert r.event_count == len(mine)
            assert r.applied_count == len(done)
            assert r.failed_count == sum(e.status == "failed" for e in mine)
            assert r.conflict_count == sum(e.status == "conflict" for e in mine)
            assert r.tokens_saved == sum(e.tokens_saved for e in done)
            assert r.messages_removed == sum(e.messages_before - e.messages_after for e in done)
            assert r.prompt_tokens == sum(e.prompt_tokens or 0 for e in mine)
            assert r.completion_tokens == sum(e.completion_tokens or 0 for e in mine)
            timed = [e.latency_ms for e in mine if e.latency_ms is not None]
            assert r.timed_count == len(timed)
            if timed:
                assert r.mean_latency_ms == pytest.approx(sum(timed) / len(timed))
            else:
                assert r.mean_latency_ms is None


def test_savings_equal_what_left_the_working_context(population: Population) -> None:
    """Only compressions shrink a session, so all its savings are the originals' tokens minus
    the working tokens now, and the removed messages likewise."""
    pop = population
    for s in pop.sessions:
        mem = pop.memory(s)
        row = pop.sql(
            "SELECT coalesce(sum(tokens_saved), 0) AS saved, "
            "coalesce(sum(messages_removed), 0) AS removed "
            "FROM autoctx_savings_by_strategy WHERE session_id = :s",
            s=s.session_id,
        )[0]
        assert row.saved == sum(s.original_tokens.values()) - mem.token_count()
        assert row.removed == len(s.original_tokens) - mem.message_count()


def test_savings_usage_matches_what_the_summarizer_reported(population: Population) -> None:
    pop = population
    for s in (pop.chat, pop.task):
        assert isinstance(s.summarizer, CountingSummarizer)
        row = pop.sql(
            "SELECT sum(prompt_tokens) AS prompt, sum(completion_tokens) AS completion "
            "FROM autoctx_savings_by_strategy WHERE session_id = :s",
            s=s.session_id,
        )[0]
        assert s.summarizer.calls > 0
        assert (row.prompt, row.completion) == (
            s.summarizer.prompt_tokens,
            s.summarizer.completion_tokens,
        )


def test_savings_global_form_is_a_group_by(population: Population) -> None:
    pop = population
    per_session = pop.sql("SELECT strategy, tokens_saved FROM autoctx_savings_by_strategy")
    expected: dict[int, int] = {}
    for r in per_session:
        expected[r.strategy] = expected.get(r.strategy, 0) + r.tokens_saved
    rows = pop.sql(
        "SELECT strategy, sum(tokens_saved) AS saved FROM autoctx_savings_by_strategy "
        "GROUP BY strategy",
    )
    assert {r.strategy: r.saved for r in rows} == expected
    ours = sum(e.tokens_saved for s in pop.sessions for e in applied(events_of(pop, s)))
    fork = AutoContextMemory.open(pop.fork_id, pop.db_url, tenant="acme", create=False)
    ours += sum(e.tokens_saved for e in applied(fork.events()) if not e.inherited)
    # The module has a database of its own: the global figure is exactly our sessions'.
    assert sum(expected.values()) == ours > 0


# ---------------------------------------------------------------------------------------------
# autoctx_session_cost
# ---------------------------------------------------------------------------------------------


def cost_of(pop: Population, s: Session) -> sa.Row[Any]:
    rows = pop.sql("SELECT * FROM autoctx_session_cost WHERE session_id = :s", s=s.session_id)
    assert len(rows) == 1
    return rows[0]


def test_session_cost_counts_calls_tokens_and_time(population: Population) -> None:
    pop = population
    for s in (pop.chat, pop.task):
        assert isinstance(s.summarizer, CountingSummarizer)
        events = events_of(pop, s)
        row = cost_of(pop, s)
        assert row.tenant == "acme"
        assert row.model == "gpt-4o"
        assert row.event_count == len(events)
        assert row.applied_count == len(applied(events))
        assert row.failed_count == sum(e.status == "failed" for e in events)
        # Each answer the summarizer gave is on exactly one event (applied, or failed for
        # no_gain or over_budget).
        assert row.llm_calls == s.summarizer.calls
        assert row.prompt_tokens == s.summarizer.prompt_tokens
        assert row.completion_tokens == s.summarizer.completion_tokens
        assert row.total_latency_ms == pytest.approx(sum(e.latency_ms or 0 for e in events))
        assert row.tokens_saved == sum(e.tokens_saved for e in applied(events))
        stamps = [e.created_at for e in applied(events) if e.created_at is not None]
        assert row.first_compression_at == min(stamps)
        assert row.last_compression_at == max(stamps)


def test_session_cost_of_failures_and_quiet_sessions(population: Population) -> None:
    pop = population
    failing = cost_of(pop, pop.failing)
    assert failing.tenant == "beta"
    assert isinstance(pop.failing.summarizer, FailingSummarizer)
    # A call that returned no answer: a failed event, not an LLM call, no usage.
    assert failing.failed_count == pop.failing.summarizer.calls > 0
    assert failing.llm_calls == 0
    assert (failing.prompt_tokens, failing.completion_tokens) == (0, 0)
    assert failing.applied_count > 0 and failing.tokens_saved > 0

    quiet = cost_of(pop, pop.quiet)
    assert quiet.tenant is None
    assert (quiet.event_count, quiet.llm_calls, quiet.tokens_saved) == (0, 0, 0)
    assert quiet.first_compression_at is None and quiet.last_event_at is None


# ---------------------------------------------------------------------------------------------
# autoctx_lineage and autoctx_coverage, against reload
# ---------------------------------------------------------------------------------------------


def expand(
    mem: AutoContextMemory, offload_of: dict[int, Any], summary_id: int
) -> set[tuple[int, int, bool]]:
    """(message id, depth, is original) of everything `summary_id` stands for, found through
    the public reload, one level at a time."""
    out: set[tuple[int, int, bool]] = set()
    frontier = [(summary_id, 0)]
    while frontier:
        sid, depth = frontier.pop()
        for m in mem.reload(offload_of[sid]):
            assert m.id is not None
            out.add((m.id, depth + 1, m.kind == "original"))
            if m.kind != "original":
                frontier.append((m.id, depth + 1))
    return out


@pytest.mark.parametrize("which", ["chat", "task", "failing", "conflict"])
def test_lineage_of_every_summary_equals_recursive_reload(
    population: Population, which: str
) -> None:
    pop = population
    s: Session = getattr(pop, which)
    mem = pop.memory(s)
    offload_of = offload_of_summaries(mem)
    rows = pop.sql("SELECT * FROM autoctx_lineage WHERE session_id = :s", s=s.session_id)
    by_summary: dict[int, set[tuple[int, int, bool]]] = {}
    for r in rows:
        by_summary.setdefault(r.summary_id, set()).add((r.message_id, r.depth, r.is_original))
        assert r.path[0] == r.summary_id and r.path[-1] == r.message_id
        assert len(r.path) == r.depth + 1
        assert r.is_original == (r.kind == "original")
    assert set(by_summary) == set(offload_of)
    for summary_id, got in by_summary.items():
        assert got == expand(mem, offload_of, summary_id)
        assert any(original for _, _, original in got), "every lineage reaches originals"


def test_lineage_of_a_summary_of_summaries_reaches_originals_at_depth_two(
    population: Population,
) -> None:
    pop = population
    rows = pop.sql(
        "SELECT summary_id, max(depth) AS depth FROM autoctx_lineage WHERE session_id = :s "
        "GROUP BY summary_id HAVING max(depth) >= 2",
        s=pop.chat.session_id,
    )
    assert rows, "the chat's round summaries fold earlier tool-run summaries"
    summary_id = rows[0].summary_id
    originals = pop.sql(
        "SELECT message_id, depth, event_id FROM autoctx_lineage "
        "WHERE session_id = :s AND summary_id = :x AND is_original ORDER BY message_id",
        s=pop.chat.session_id,
        x=summary_id,
    )
    assert {r.depth for r in originals} >= {2}
    assert all(r.message_id in pop.chat.original_tokens for r in originals)
    # The depth-2 originals were replaced by the inner summary's event, not the outer one's.
    outer_event = pop.sql(
        "SELECT event_id FROM messages WHERE session_id = :s AND id = :x",
        s=pop.chat.session_id,
        x=summary_id,
    )[0].event_id
    assert {r.event_id for r in originals if r.depth == 2}.isdisjoint({outer_event})
    assert {r.event_id for r in originals if r.depth == 1} <= {outer_event}


@pytest.mark.parametrize("which", ["chat", "task", "failing", "conflict", "quiet"])
def test_coverage_points_every_replaced_original_at_its_working_message(
    population: Population, which: str
) -> None:
    pop = population
    s: Session = getattr(pop, which)
    mem = pop.memory(s)
    working = {m.id: m.kind for m in mem.messages()}
    offload_of = offload_of_summaries(mem)
    # Expected from reload: every working summary, expanded, covers its originals.
    expected: dict[int, tuple[int, int]] = {}
    for wid, kind in working.items():
        assert wid is not None
        if kind != "original":
            for mid, depth, original in expand(mem, offload_of, wid):
                if original:
                    assert mid not in expected, "an original is covered once"
                    expected[mid] = (wid, depth)
    replaced = set(s.original_tokens) - set(working)
    assert set(expected) == replaced

    rows = pop.sql("SELECT * FROM autoctx_coverage WHERE session_id = :s", s=s.session_id)
    assert {r.original_id: (r.covering_message_id, r.depth) for r in rows} == expected
    assert len(rows) == len(replaced)
    for r in rows:
        assert r.covering_kind == working[r.covering_message_id]


def test_coverage_and_lineage_answer_each_other(population: Population) -> None:
    """'Which working message covers original Y' and 'which originals stand behind X' are each
    one query, and they agree."""
    pop = population
    sid = pop.chat.session_id
    deep = pop.sql(
        "SELECT original_id, covering_message_id, depth FROM autoctx_coverage "
        "WHERE session_id = :s AND depth >= 2 ORDER BY original_id LIMIT 1",
        s=sid,
    )
    assert deep
    original, cover, depth = deep[0].original_id, deep[0].covering_message_id, deep[0].depth
    behind = pop.sql(
        "SELECT message_id, depth FROM autoctx_lineage "
        "WHERE session_id = :s AND summary_id = :x AND is_original",
        s=sid,
        x=cover,
    )
    assert (original, depth) in {(r.message_id, r.depth) for r in behind}
    in_working = pop.sql(
        "SELECT count(*) FROM working_set WHERE session_id = :s AND message_id = :x",
        s=sid,
        x=cover,
    )
    assert in_working[0][0] == 1


# In the smoke subset too: plans and DDL are what differ between server versions.
@pytest.mark.embedded
def test_lineage_and_coverage_filters_reach_the_indexes(population: Population) -> None:
    """A filter on session and message id lands on the messages primary key, and every step of
    the walk has an index path: the views do not walk the lineage of every session first and
    filter afterwards, as a plain recursive CTE would.

    The test tables are tiny, so the planner would rightly prefer sequential scans; turning
    them off asks whether an index path exists at all (if none did, it would still seq-scan).
    """
    pop = population
    sid = pop.chat.session_id
    queries = {
        "lineage": "SELECT * FROM autoctx_lineage WHERE session_id = :s AND summary_id = :x",
        "coverage": "SELECT * FROM autoctx_coverage WHERE session_id = :s AND original_id = :x",
    }
    x = 7
    # The literal id, not `id = walk.message_id`: the filter itself reached the index.
    pushed_down = re.compile(
        re.escape(f"Index Cond: ((session_id = '{sid}'::text) AND (id = ") + rf"'?{x}'?(::\w+)?\)\)"
    )
    engine = pop.memory(pop.chat).engine
    with engine.connect() as conn:
        conn.execute(sa.text("SET LOCAL enable_seqscan = off"))
        for name, query in queries.items():
            plan = "\n".join(
                r[0] for r in conn.execute(sa.text("EXPLAIN " + query), {"s": sid, "x": x})
            )
            assert pushed_down.search(plan), (name, plan)
            assert "Seq Scan" not in plan, (name, plan)
        conn.rollback()


# ---------------------------------------------------------------------------------------------
# autoctx_problem_sessions
# ---------------------------------------------------------------------------------------------


def test_problem_sessions_lists_failures_and_conflicts_only(population: Population) -> None:
    pop = population
    ours = {s.session_id for s in pop.sessions}
    rows = {
        r.session_id: r
        for r in pop.sql("SELECT * FROM autoctx_problem_sessions")
        if r.session_id in ours
    }
    # The chat's one discarded summary (no_gain) makes it a problem session too.
    troubled = (pop.chat, pop.failing, pop.conflict)
    assert set(rows) == {s.session_id for s in troubled}

    for s in troubled:
        events = events_of(pop, s)
        problems = [e for e in events if e.status in ("failed", "conflict")]
        last = problems[-1]
        row = rows[s.session_id]
        assert row.tenant == s.tenant
        assert row.failed_count == sum(e.status == "failed" for e in problems)
        assert row.conflict_count == sum(e.status == "conflict" for e in problems)
        assert (row.last_status, row.last_strategy, row.last_error) == (
            last.status,
            last.strategy,
            last.error,
        )
        assert row.last_event_id == last.id
        assert row.last_problem_at == max(e.created_at for e in problems if e.created_at)

    failing = rows[pop.failing.session_id]
    assert failing.conflict_count == 0
    assert isinstance(pop.failing.summarizer, FailingSummarizer)
    assert failing.last_error.endswith(
        f"call {pop.failing.summarizer.calls}: no answer from the endpoint"
    )
    assert rows[pop.conflict.session_id].conflict_count > 0
    assert rows[pop.chat.session_id].failed_count == 1


# ---------------------------------------------------------------------------------------------
# docs/audit.md
# ---------------------------------------------------------------------------------------------


def sql_blocks() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_the_cookbook_has_ten_questions() -> None:
    text = DOC.read_text(encoding="utf-8")
    cookbook = text.split("## Cookbook", 1)[1]
    headings = re.findall(r"^### (\d+)\. ", cookbook, flags=re.MULTILINE)
    assert headings == [str(n) for n in range(1, 11)]
    # Each question is answered by a SQL block under its heading.
    for section in re.split(r"^### \d+\. ", cookbook, flags=re.MULTILINE)[1:]:
        assert "```sql\n" in section
    for view in (*AUDIT_VIEWS, *LIFECYCLE_VIEWS, *FACT_VIEWS):
        assert f"### `{view}`" in text


def doc_params(pop: Population) -> dict[str, Any]:
    """The chat session, a summary of summaries in it, and an original that summary covers."""
    sid = pop.chat.session_id
    row = pop.sql(
        "SELECT summary_id, message_id FROM autoctx_lineage "
        "WHERE session_id = :s AND is_original AND depth >= 2 "
        "ORDER BY summary_id, message_id LIMIT 1",
        s=sid,
    )[0]
    return {"session_id": sid, "summary_id": row.summary_id, "message_id": row.message_id}


@pytest.mark.parametrize("index", range(len(sql_blocks())))
def test_every_documented_query_runs_and_answers(population: Population, index: int) -> None:
    pop = population
    query = sql_blocks()[index]
    params = doc_params(pop)
    names = set(re.findall(r"(?<![:\w]):([a-z_]+)", query))
    assert names <= set(params), f"undocumented parameters {names - set(params)}"
    rows = pop.sql(query, **{k: params[k] for k in names})
    assert rows, f"query {index + 1} of docs/audit.md returned nothing on a populated database"


def test_documented_coverage_and_lineage_queries_answer_about_the_message(
    population: Population,
) -> None:
    pop = population
    params = doc_params(pop)
    coverage_q = next(q for q in sql_blocks() if "FROM autoctx_coverage c" in q)
    lineage_q = next(q for q in sql_blocks() if "FROM autoctx_lineage l" in q)
    cover = pop.sql(coverage_q, session_id=params["session_id"], message_id=params["message_id"])
    assert len(cover) == 1 and cover[0].depth >= 2
    originals = pop.sql(
        lineage_q, session_id=params["session_id"], summary_id=cover[0].covering_message_id
    )
    assert params["message_id"] in {r.message_id for r in originals}


# ---------------------------------------------------------------------------------------------
# The migration
# ---------------------------------------------------------------------------------------------


def view_names(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT viewname FROM pg_views WHERE schemaname = current_schema()")
        )
        return {r[0] for r in rows}


# In the smoke subset too: plans and DDL are what differ between server versions.
@pytest.mark.embedded
def test_downgrade_to_0001_drops_the_views_and_upgrade_restores_them(empty_db_url: str) -> None:
    engine = create_engine(normalize_url(empty_db_url), poolclass=sa.NullPool)
    try:
        upgrade(engine)
        assert set(AUDIT_VIEWS) <= view_names(engine)
        with engine.connect() as conn:
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0001")
            conn.commit()
        assert current_revision(engine) == "0001"
        assert view_names(engine).isdisjoint(AUDIT_VIEWS)
        with engine.connect() as conn:
            tables = {r[0] for r in conn.execute(sa.text("SELECT tablename FROM pg_tables"))}
        assert {"sessions", "messages", "lineage", "compression_events"} <= tables
        upgrade(engine)
        assert set(AUDIT_VIEWS) <= view_names(engine)
        with engine.connect() as conn:
            for view in AUDIT_VIEWS:
                conn.execute(sa.text(f"SELECT * FROM {view} LIMIT 1"))
    finally:
        engine.dispose()


def test_the_offline_summarizer_is_no_llm_call(db_url: str, session_id: str) -> None:
    """A session summarized offline used to report every offline summary as an "LLM call"."""
    config = AutoContextConfig(max_tokens=8_000, msg_threshold=40)
    mem = AutoContextMemory.open(session_id, db_url, config, summarizer=OfflineSummarizer())
    mem.add(long_task(7, steps=60))
    events = mem.compress_if_needed()
    assert [e for e in events if e.status == "applied" and e.model == OFFLINE_MODEL]
    (row,) = sql(
        mem, "SELECT llm_calls FROM autoctx_session_cost WHERE session_id = :s", s=session_id
    )
    assert row.llm_calls == 0
