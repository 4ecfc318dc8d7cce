"""A catalogue of malformed inputs (SPEC.md section 1, and the edges of the public API).

Each case is its own test: the call fails with autoctx's error naming the problem, stores
nothing (the session row and the row count of every table are unchanged), and the session still
opens, converts to valid OpenAI chat and has totals equal to a recount.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest
import sqlalchemy as sa

from autoctx import (
    AutoContextConfig,
    AutoContextMemory,
    ConfigError,
    DatabaseUnavailable,
    InvalidMessage,
    InvalidOffloadId,
    InvalidSessionId,
    Msg,
    OffloadNotFound,
    SessionNotFound,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from autoctx.errors import InvalidPlan
from autoctx.memory import dispose_engines
from autoctx.store.tables import SESSION_TABLES
from autoctx.summarizers import OfflineSummarizer
from tests.invariants import assert_totals_match, assert_valid_openai_chat


@dataclass
class Ctx:
    """What a case gets: a session with a little valid history, and how to open others."""

    mem: AutoContextMemory
    db_url: str

    def open(self, sid: str | None = None, **config: Any) -> AutoContextMemory:
        cfg = dataclasses.replace(AutoContextConfig(), **config)
        return AutoContextMemory.open(
            self.mem.session_id if sid is None else sid,
            self.db_url,
            cfg,
            summarizer=OfflineSummarizer(),
        )


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[Ctx], object]
    error: type[Exception]
    #: A fragment of the message that names the problem (case-insensitive).
    fragment: str
    #: Run before the "before" picture is taken (to build the situation the case needs).
    setup: Callable[[Ctx], object] | None = None


def _call(call_id: str, args: Any = '{"path": "a.py"}', name: str = "read_file") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _assistant_calls(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


TWENTY_MB = 20 * 1024 * 1024


def _big_text(chars: int) -> str:
    unit = "2025-11-30T10:00:00Z INFO worker=17 request id=9f3a handled in 12 ms path=/v1/items\n"
    return (unit * (chars // len(unit) + 1))[:chars]


def _open_call_elsewhere(ctx: Ctx) -> None:
    other = ctx.open(f"{ctx.mem.session_id}-other")
    other.add(_assistant_calls(_call("shared_call_7")))


CASES: list[Case] = [
    # -- add(): roles, shapes, tool calls -----------------------------------------------------
    Case(
        "unknown_role_openai",
        lambda c: c.mem.add({"role": "robot", "content": "hi"}),
        InvalidMessage,
        "unknown role 'robot'",
    ),
    Case(
        "unknown_role_msg",
        lambda c: c.mem.add(Msg(cast(Any, "robot"), (TextBlock("hi"),))),
        InvalidMessage,
        "unknown role",
    ),
    Case(
        "tool_result_for_no_open_call",
        lambda c: c.mem.add({"role": "tool", "tool_call_id": "call_nope", "content": "x"}),
        InvalidMessage,
        "answers no open call",
    ),
    Case(
        "tool_result_for_a_call_of_another_session",
        lambda c: c.mem.add({"role": "tool", "tool_call_id": "shared_call_7", "content": "x"}),
        InvalidMessage,
        "'shared_call_7' answers no open call",
        setup=_open_call_elsewhere,
    ),
    Case(
        "call_id_reused_while_open",
        lambda c: c.mem.add(_assistant_calls(_call("c1"), _call("c1"))),
        InvalidMessage,
        "used twice",
    ),
    Case(
        "message_while_calls_open",
        lambda c: c.mem.add({"role": "user", "content": "next question"}),
        InvalidMessage,
        "still unanswered",
        setup=lambda c: c.mem.add(_assistant_calls(_call("pending_1"))),
    ),
    Case(
        "second_call_while_calls_open",
        lambda c: c.mem.add(_assistant_calls(_call("pending_2"))),
        InvalidMessage,
        "still unanswered",
        setup=lambda c: c.mem.add(_assistant_calls(_call("pending_1"))),
    ),
    Case(
        "arguments_not_json",
        lambda c: c.mem.add(_assistant_calls(_call("c2", "{path: a.py"))),
        InvalidMessage,
        "not valid JSON",
    ),
    Case(
        "arguments_not_a_string",
        lambda c: c.mem.add(_assistant_calls(_call("c3", {"path": "a.py"}))),
        InvalidMessage,
        "must be a JSON string",
    ),
    Case(
        "arguments_nested_too_deep",
        lambda c: c.mem.add(_assistant_calls(_call("c4", '{"a":' * 5000 + "1" + "}" * 5000))),
        InvalidMessage,
        "nested deeper",
    ),
    Case(
        "metadata_nested_too_deep",
        lambda c: c.mem.add(Msg.user("hi", metadata=_nested(1000))),
        InvalidMessage,
        "nested deeper",
    ),
    Case(
        "metadata_nested_just_too_deep",
        # 201 levels: json.dumps writes it without complaint; autoctx's limit is 200.
        lambda c: c.mem.add(Msg.user("hi", metadata=_nested(201))),
        InvalidMessage,
        "nested deeper",
    ),
    Case(
        "metadata_with_nul",
        lambda c: c.mem.add(Msg.user("hi", metadata={"tool": {"log": ["ok", "a\x00b"]}})),
        InvalidMessage,
        "NUL",
    ),
    Case(
        "metadata_key_with_lone_surrogate",
        lambda c: c.mem.add(Msg.user("hi", metadata={"k\udc80": 1})),
        InvalidMessage,
        "surrogate",
    ),
    Case(
        "metadata_not_json",
        lambda c: c.mem.add(Msg.user("hi", metadata={"tags": {1, 2}})),
        InvalidMessage,
        "not JSON-serialisable",
    ),
    Case(
        "tool_call_on_a_user_message",
        lambda c: c.mem.add(Msg("user", (ToolUseBlock("c5", "read_file", "{}"),))),
        InvalidMessage,
        "only assistant messages may carry tool calls",
    ),
    Case(
        "tool_result_on_an_assistant_message",
        lambda c: c.mem.add(Msg("assistant", (ToolResultBlock("c6", "x"),))),
        InvalidMessage,
        "tool results belong on tool messages",
    ),
    Case(
        "tool_message_without_call_id",
        lambda c: c.mem.add({"role": "tool", "content": "x"}),
        InvalidMessage,
        "tool_call_id",
    ),
    Case(
        "content_of_wrong_type",
        lambda c: c.mem.add({"role": "user", "content": 42}),
        InvalidMessage,
        "'content' must be",
    ),
    Case(
        "kind_set_by_the_caller",
        lambda c: c.mem.add(Msg.user("hi", kind="preview")),
        InvalidMessage,
        "kind 'preview'",
    ),
    Case(
        "a_string_instead_of_a_message",
        lambda c: c.mem.add(cast(Any, "hello")),
        InvalidMessage,
        "not a string",
    ),
    Case("not_a_message_at_all", lambda c: c.mem.add(cast(Any, 42)), InvalidMessage, "Msg"),
    Case("none_instead_of_messages", lambda c: c.mem.add(cast(Any, None)), InvalidMessage, "Msg"),
    Case(
        "a_number_in_the_list",
        lambda c: c.mem.add([Msg.user("ok"), cast(Any, 42)]),
        InvalidMessage,
        "message 1",
    ),
    Case(
        "bad_message_at_the_end_of_a_batch",
        lambda c: c.mem.add([Msg.user("q"), Msg.assistant("a"), {"role": "robot", "content": "x"}]),
        InvalidMessage,
        "message 2",
    ),
    # -- add(): text PostgreSQL cannot hold, sizes ---------------------------------------------
    Case("nul_in_text", lambda c: c.mem.add(Msg.user("a\x00b")), InvalidMessage, "NUL"),
    Case(
        "nul_in_tool_output",
        lambda c: c.mem.add(
            [Msg.assistant(None, [ToolUseBlock("c7", "cat", "{}")]), Msg.tool("c7", "bin\x00ary")]
        ),
        InvalidMessage,
        "NUL",
    ),
    Case(
        "nul_in_arguments",
        lambda c: c.mem.add(
            _assistant_calls(_call("c8", '{"p": "a\\u0000b"}'.replace("\\u0000", "\x00")))
        ),
        InvalidMessage,
        "NUL",
    ),
    Case(
        "lone_surrogate_in_text",
        lambda c: c.mem.add(Msg.user("bad \ud800 text")),
        InvalidMessage,
        "surrogate",
    ),
    Case(
        "lone_surrogate_in_tool_name",
        lambda c: c.mem.add(_assistant_calls(_call("c9", "{}", name="read\udfff"))),
        InvalidMessage,
        "surrogate",
    ),
    Case(
        "over_the_size_cap",
        lambda c: c.open(max_message_chars=1000).add(Msg.user("x" * 1001)),
        InvalidMessage,
        "over the cap of 1000",
    ),
    Case(
        "twenty_mb_over_the_default_cap",
        lambda c: c.mem.add(Msg.user(_big_text(TWENTY_MB))),
        InvalidMessage,
        "over the cap",
    ),
    # -- session ids and database URLs --------------------------------------------------------
    Case("session_id_empty", lambda c: c.open(""), InvalidSessionId, "empty"),
    Case("session_id_over_255", lambda c: c.open("s" * 256), InvalidSessionId, "limit is 255"),
    Case(
        "session_id_not_a_string",
        lambda c: AutoContextMemory.open(cast(Any, 42), c.db_url),
        InvalidSessionId,
        "must be a string",
    ),
    Case("session_id_with_nul", lambda c: c.open("a\x00b"), InvalidSessionId, "NUL"),
    Case("session_id_lone_surrogate", lambda c: c.open("a\udc80b"), InvalidSessionId, "surrogate"),
    Case(
        "unknown_session_without_create",
        lambda c: AutoContextMemory.open(f"nobody-{uuid.uuid4()}", c.db_url, create=False),
        SessionNotFound,
        "does not exist",
    ),
    Case(
        "unreachable_database",
        lambda c: AutoContextMemory.open("s", "postgresql://nobody@127.0.0.1:1/nothing"),
        DatabaseUnavailable,
        "cannot connect",
    ),
    Case(
        "sqlite_database_url",
        lambda c: AutoContextMemory.open("s", "sqlite:///autoctx.db"),
        DatabaseUnavailable,
        "needs PostgreSQL",
    ),
    Case(
        "malformed_database_url",
        lambda c: AutoContextMemory.open("s", "not a url"),
        DatabaseUnavailable,
        "not a valid URL",
    ),
    # -- reload -------------------------------------------------------------------------------
    Case(
        "reload_uuid_with_sql",
        lambda c: c.mem.reload("00000000-0000-0000-0000-000000000000' OR '1'='1"),
        InvalidOffloadId,
        "not an offload id",
    ),
    Case(
        "reload_sql_only",
        lambda c: c.mem.reload("'; DROP TABLE messages; --"),
        InvalidOffloadId,
        "not an offload id",
    ),
    Case("reload_empty", lambda c: c.mem.reload(""), InvalidOffloadId, "empty"),
    Case(
        "reload_unknown_uuid",
        lambda c: c.mem.reload(str(uuid.uuid4())),
        OffloadNotFound,
        "no offloaded context",
    ),
    Case(
        "reload_negative_offset",
        lambda c: c.mem.reload(str(uuid.uuid4()), offset=-1),
        ValueError,
        "offset",
    ),
    # -- config -------------------------------------------------------------------------------
    Case(
        "negative_msg_threshold",
        lambda c: AutoContextConfig(msg_threshold=-1),
        ConfigError,
        "msg_threshold",
    ),
    Case("zero_max_tokens", lambda c: AutoContextConfig(max_tokens=0), ConfigError, "max_tokens"),
    Case(
        "negative_min_compress_tokens",
        lambda c: AutoContextConfig(min_compress_tokens=-5),
        ConfigError,
        "min_compress_tokens",
    ),
    Case(
        "token_ratio_of_one",
        lambda c: AutoContextConfig(token_ratio=1.0),
        ConfigError,
        "token_ratio",
    ),
    Case(
        "target_above_trigger",
        lambda c: AutoContextConfig(token_ratio=0.5, target_ratio=0.7),
        ConfigError,
        "target_ratio",
    ),
    Case(
        "preview_longer_than_large",
        lambda c: AutoContextConfig(preview_chars=6000),
        ConfigError,
        "preview_chars",
    ),
    Case(
        "boolean_threshold",
        lambda c: AutoContextConfig(msg_threshold=True),
        ConfigError,
        "msg_threshold",
    ),
    Case(
        "prompt_for_a_strategy_without_llm",
        lambda c: AutoContextConfig(prompts={2: "hi"}),
        ConfigError,
        "prompts",
    ),
    Case(
        "zero_size_cap",
        lambda c: AutoContextConfig(max_message_chars=0),
        ConfigError,
        "max_message_chars",
    ),
    # -- plans --------------------------------------------------------------------------------
    Case(
        "plan_with_a_bad_goal",
        lambda c: c.mem.set_plan({"goal": 3, "steps": []}),
        InvalidPlan,
        "goal",
    ),
]


def _picture(ctx: Ctx) -> tuple[Any, ...]:
    """The session row and the row count of every session table of the database."""
    counts = " , ".join(f"(select count(*) from {t.name})" for t in SESSION_TABLES)
    with ctx.mem.engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "select version, message_count, token_count, open_calls, next_message_id, "
                f"next_event_id, {counts} from sessions where session_id = :s"
            ),
            {"s": ctx.mem.session_id},
        ).one()
    return tuple(row)


@pytest.fixture
def ctx(db_url: str, session_id: str) -> Ctx:
    mem = AutoContextMemory.open(session_id, db_url, summarizer=OfflineSummarizer())
    mem.add(
        [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Read a.py"},
            _assistant_calls(_call("call_0")),
            {"role": "tool", "tool_call_id": "call_0", "content": "print('a')"},
            {"role": "assistant", "content": "a.py prints 'a'."},
        ]
    )
    return Ctx(mem, db_url)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_refused_and_stores_nothing(case: Case, ctx: Ctx) -> None:
    if case.setup is not None:
        case.setup(ctx)
    before = _picture(ctx)
    with pytest.raises(case.error) as info:
        case.call(ctx)
    assert case.fragment.lower() in str(info.value).lower(), str(info.value)[:500]
    assert _picture(ctx) == before, "the failing call stored something"
    # The session still opens (in a fresh engine) and is whole.
    dispose_engines()
    again = AutoContextMemory.open(ctx.mem.session_id, ctx.db_url, create=False)
    assert_valid_openai_chat(again.to_openai())
    assert_totals_match(again)


def test_the_catalogue_has_at_least_25_distinct_inputs() -> None:
    names = [c.name for c in CASES]
    assert len(set(names)) == len(names)
    print(f"bad-input catalogue: {len(names)} cases")
    assert len(CASES) >= 25


def test_twenty_mb_message_is_accepted_when_the_cap_is_raised(ctx: Ctx) -> None:
    mem = ctx.open(max_message_chars=TWENTY_MB)
    (stored,) = mem.add(Msg.user(_big_text(TWENTY_MB)))
    (back,) = [m for m in mem.messages() if m.id == stored.id]
    assert back.text == _big_text(TWENTY_MB)
    assert_valid_openai_chat(mem.to_openai())
    assert_totals_match(mem)


def test_metadata_that_only_looks_suspicious_is_stored_exactly(ctx: Ctx) -> None:
    """The metadata check's fast path raises false alarms on text that merely resembles a
    problem (an escaped NUL written out, brackets inside strings, a 200-level nesting); the
    exact check then clears them and the metadata is stored as given."""
    metadata = {
        "escaped": "a literal \\u0000 is six characters, not a NUL",
        "brackets": "[" * 500 + "{" * 500,
        "deep": _nested(199),
    }
    (stored,) = ctx.mem.add(Msg.user("hi", metadata=metadata))
    (back,) = ctx.mem.store.load_messages(ctx.mem.session_id, [cast(int, stored.id)]).values()
    assert back.metadata == metadata
    assert_totals_match(ctx.mem)


def test_hostile_looking_session_ids_are_plain_text(db_url: str) -> None:
    """Ids that look like SQL are valid ids: stored as given, never interpreted."""
    ids = ["x'; DROP TABLE sessions; --", "00000000-0000-0000-0000-000000000000' OR '1'='1", "%_\\"]
    for sid in ids:
        mem = AutoContextMemory.open(sid, db_url, summarizer=OfflineSummarizer())
        mem.add(Msg.user(f"hello from {sid}"))
    for sid in ids:
        mem = AutoContextMemory.open(sid, db_url, create=False)
        assert [m.text for m in mem.messages()] == [f"hello from {sid}"]
        assert_totals_match(mem)
    dispose_engines()


def test_developer_role_is_accepted_as_system(ctx: Ctx) -> None:
    (stored,) = ctx.mem.add({"role": "developer", "content": "Be terse."})
    assert stored.role == "system"
    assert ctx.mem.to_openai()[-1] == {"role": "developer", "content": "Be terse."}
