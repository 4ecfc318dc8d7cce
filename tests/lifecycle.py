"""Sessions and checks shared by the fork, erase and import tests (tests/test_fork.py,
tests/test_erase.py, tests/test_import.py)."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from autoctx import (
    AutoContextConfig,
    AutoContextMemory,
    Msg,
    OpaqueBlock,
    SummaryRequest,
    SummaryResult,
    TextBlock,
    ToolUseBlock,
)
from tests.dbsql import sql
from tests.invariants import (
    assert_every_original_reachable,
    assert_totals_match,
    assert_valid_openai_chat,
)

#: Small thresholds: a few rounds make every rung act, the fold included (summaries of
#: summaries, so lineage is several levels deep). The tests name messages by the ids these
#: rounds get, so the ladder runs only at its trigger (no early masking) and stops at the 0.6
#: target they were written for.
CONFIG = AutoContextConfig(
    max_tokens=3000,
    target_ratio=0.6,
    mask_ratio=None,
    msg_threshold=40,
    large_payload_chars=1000,
    preview_chars=100,
    reload_page_chars=500,
    last_keep=6,
    min_tool_run=2,
    min_compress_tokens=300,
)


class EchoSummarizer:
    """A summarizer that repeats every transcript line holding `needle` (as an LLM repeats the
    facts it is given), so that summaries of summaries carry it down the lineage."""

    def __init__(self, needle: str) -> None:
        self.needle = needle

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        lines = [ln.strip()[:120] for ln in request.transcript.splitlines() if self.needle in ln]
        text = "\n".join(["Summary of the work so far.", *lines[:3]])
        return SummaryResult(text=text, model="echo")


def round_of(i: int, secret: str | None = None) -> list[Msg]:
    """One round: a user request, a tool call with a large output, a final answer. With
    `secret`, it is in the text, the tool arguments, the output and the metadata."""
    s = f" {secret}" if secret else ""
    return [
        Msg.user(f"task {i}: look at module {i}{s}", metadata={"ticket": f"T-{i}{s}"}),
        Msg.assistant(
            None, [ToolUseBlock(f"c{i}", "read_file", json.dumps({"path": f"/src/m{i}.py{s}"}))]
        ),
        Msg.tool(
            f"c{i}",
            "\n".join(f"{n:4d} def f{n}(x): return x + {n}  # module {i}{s}" for n in range(60)),
        ),
        Msg.assistant(f"done {i}: module {i} is fine{s}"),
    ]


def build(mem: AutoContextMemory, rounds: int, secret: str | None = None, at: int = 0) -> None:
    """`rounds` rounds (the secret in round `at`), compressing after each as an agent does."""
    for i in range(rounds):
        mem.add(round_of(i, secret if i == at else None))
        mem.compress_if_needed()


def opaque_round(i: int, secret: str) -> list[Msg]:
    """A message with text and an opaque block, both holding the secret."""
    return [
        Msg(
            "user",
            (
                TextBlock(f"see image {i}: {secret}"),
                OpaqueBlock({"type": "image_url", "x": secret}),
            ),
        ),
        Msg.assistant(f"noted {i}"),
    ]


def assert_valid_session(mem: AutoContextMemory) -> None:
    """The working context is valid OpenAI chat, its totals equal a recount, and every
    original is reachable by reload from it."""
    assert_valid_openai_chat(mem.to_openai())
    assert_totals_match(mem)
    assert_every_original_reachable(mem)


def session_rows(mem: AutoContextMemory) -> dict[str, Any]:
    """Every row of the session, as plain data (to compare before and after)."""
    sid = mem.session_id
    out: dict[str, Any] = {}
    for table, order in (
        ("sessions", "session_id"),
        ("messages", "id"),
        ("working_set", "position"),
        ("compression_events", "id"),
        ("offloads", "uuid"),
        ("lineage", "summary_id, ordinal"),
    ):
        out[table] = [
            tuple(r)
            for r in sql(
                mem, f"SELECT * FROM {table} WHERE session_id = :s ORDER BY {order}", s=sid
            )
        ]
    return out


def table_count(engine: sa.Engine, session_id: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM sessions WHERE session_id = :s"), {"s": session_id}
            ).scalar_one()
        )
