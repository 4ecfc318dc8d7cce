"""A catalogue of malformed inputs (docs/design.md §1, and the edges of the public API).

Each case is its own test: the call fails with autoctx's error naming the problem, stores
nothing (the session row and the row count of every table are unchanged), and the session still
opens, converts to valid OpenAI chat and has totals equal to a recount.
"""

from __future__ import annotations

import dataclasses
import random
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest
import sqlalchemy as sa

from autoctx import (
    AutoContextClient,
    AutoContextConfig,
    AutoContextMemory,
    ConfigError,
    DatabaseUnavailable,
    InvalidMessage,
    InvalidOffloadId,
    InvalidSessionId,
    Msg,
    OfflineSummarizer,
    OffloadNotFound,
    OpaqueBlock,
    SessionNotFound,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from autoctx._errors import InvalidPlan
from autoctx._store.tables import SESSION_TABLES
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


#: Planted in the content of the newer cases: an error text must never repeat it (docs/design.md §6:
#: errors name the session, the message and the problem, never the content).
MARKER = "do-not-echo-7f3a"
NAN = float("nan")
INF = float("inf")
#: Random letters and digits, which PostgreSQL cannot compress below its btree entry limit
#: (about 2.7 KB): a repetitive name of that length would fit once compressed.
THREE_KB = "".join(random.Random(5).choices(string.ascii_letters + string.digits, k=3000))


def _msg(**fields: Any) -> Msg:
    """A user message with some fields set to what the caller's type hints do not allow."""
    return Msg(**{"role": "user", "content": (TextBlock(MARKER),), **fields})


def _tenant(tenant: object) -> Callable[[Ctx], object]:
    return lambda c: AutoContextMemory.open(
        f"{c.mem.session_id}-tenant", c.db_url, tenant=cast(Any, tenant)
    )


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
        "not JSON-serializable",
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
    # -- add(): numbers JSON has not, and keys PostgreSQL is handed as they are ---------------
    Case(
        "metadata_with_nan",
        lambda c: c.mem.add(Msg.user(MARKER, metadata={"note": MARKER, "score": NAN})),
        InvalidMessage,
        "message 0 (user): the metadata holds a NaN or Infinity",
    ),
    Case(
        "metadata_with_infinity",
        lambda c: c.mem.add(Msg.user(MARKER, metadata={"bounds": [0, -INF]})),
        InvalidMessage,
        "NaN or Infinity",
    ),
    Case(
        "openai_extra_key_with_nan",
        lambda c: c.mem.add({"role": "user", "content": MARKER, "logprob": NAN}),
        InvalidMessage,
        "the metadata holds a NaN or Infinity",
    ),
    Case(
        "opaque_part_with_infinity",
        lambda c: c.mem.add(
            {
                "role": "user",
                "content": [{"type": "input_audio", "note": MARKER, "seconds": INF}],
            }
        ),
        InvalidMessage,
        "an opaque content part holds a NaN or Infinity",
    ),
    Case(
        "tool_call_extra_key_with_nan",
        lambda c: c.mem.add(_assistant_calls({**_call("c12", f'{{"p": "{MARKER}"}}'), "i": NAN})),
        InvalidMessage,
        "tool call 'c12' (read_file) extra keys holds a NaN",
    ),
    Case(
        "tool_call_extra_key_with_nul",
        lambda c: c.mem.add(_assistant_calls({**_call("c13"), "note": f"{MARKER}\x00"})),
        InvalidMessage,
        "extra keys contains a NUL",
    ),
    Case(
        "arguments_with_nan",
        lambda c: c.mem.add(_assistant_calls(_call("c14", f'{{"p": "{MARKER}", "x": NaN}}'))),
        InvalidMessage,
        "arguments hold NaN or Infinity",
    ),
    Case(
        "arguments_with_minus_infinity",
        lambda c: c.mem.add(_assistant_calls(_call("c15", '{"x": [1, -Infinity]}'))),
        InvalidMessage,
        "arguments hold NaN or Infinity",
    ),
    # -- add(): a Msg built with fields of the wrong type --------------------------------------
    Case("msg_role_a_number", lambda c: c.mem.add(_msg(role=3)), InvalidMessage, "unknown role 3"),
    Case(
        "msg_content_an_object",
        lambda c: c.mem.add(_msg(content=object())),
        InvalidMessage,
        "message 0 (user): 'content' must be a tuple of blocks",
    ),
    Case(
        "msg_content_a_string",
        lambda c: c.mem.add(_msg(content=MARKER)),
        InvalidMessage,
        "'content' must be a tuple of blocks",
    ),
    Case(
        "msg_tokens_a_string",
        lambda c: c.mem.add(_msg(tokens="x")),
        InvalidMessage,
        "'tokens' must be an integer or None",
    ),
    Case("msg_id_a_string", lambda c: c.mem.add(_msg(id="7")), InvalidMessage, "'id' must be"),
    Case(
        "msg_pinned_maybe",
        lambda c: c.mem.add(_msg(pinned="maybe")),
        InvalidMessage,
        "'pinned' must be True or False",
    ),
    Case(
        "msg_name_a_number",
        lambda c: c.mem.add(_msg(name=5)),
        InvalidMessage,
        "'name' must be a string or None",
    ),
    Case(
        "msg_metadata_a_list",
        lambda c: c.mem.add(_msg(metadata=[MARKER])),
        InvalidMessage,
        "'metadata' must be a dict",
    ),
    Case(
        "msg_metadata_openai_key_a_number",
        lambda c: c.mem.add(_msg(metadata={"openai": 5})),
        InvalidMessage,
        "metadata key 'openai' is reserved",
    ),
    Case(
        "msg_metadata_openai_extra_a_list",
        lambda c: c.mem.add(_msg(metadata={"openai": {"extra": [MARKER]}})),
        InvalidMessage,
        "metadata key 'openai' is reserved",
    ),
    Case(
        "text_block_of_a_number",
        lambda c: c.mem.add(_msg(content=(TextBlock(MARKER), TextBlock(cast(Any, 5))))),
        InvalidMessage,
        "content block 1 (TextBlock): 'text' must be a string",
    ),
    Case(
        "tool_call_arguments_none",
        lambda c: c.mem.add(Msg("assistant", (ToolUseBlock("c16", "read_file", cast(Any, None)),))),
        InvalidMessage,
        "(ToolUseBlock): 'arguments' must be a string",
    ),
    Case(
        "tool_call_extra_none",
        lambda c: c.mem.add(Msg("assistant", (ToolUseBlock("c17", "ls", "{}", cast(Any, None)),))),
        InvalidMessage,
        "'extra' must be a dict",
    ),
    Case(
        "tool_result_output_a_number",
        lambda c: c.mem.add(Msg("tool", (ToolResultBlock("call_0", cast(Any, 42)),))),
        InvalidMessage,
        "'output' must be a string or a tuple of TextBlocks",
    ),
    Case(
        "opaque_block_of_a_list",
        lambda c: c.mem.add(_msg(content=(OpaqueBlock(cast(Any, [MARKER])),))),
        InvalidMessage,
        "(OpaqueBlock): 'data' must be a dict",
    ),
    Case(
        "a_string_as_a_block",
        lambda c: c.mem.add(_msg(content=(MARKER,))),
        InvalidMessage,
        "a str is not a content block",
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
    Case("tenant_with_nul", _tenant("acme\x00"), InvalidSessionId, "tenant contains a NUL"),
    Case("tenant_lone_surrogate", _tenant("acme\udc80"), InvalidSessionId, "surrogate"),
    Case("tenant_over_255", _tenant("t" * 256), InvalidSessionId, "limit is 255"),
    Case("tenant_of_3_kb", _tenant(THREE_KB), InvalidSessionId, "limit is 255"),
    Case("tenant_not_a_string", _tenant(42), InvalidSessionId, "must be a string or None"),
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
        "reload_id_not_a_string",
        lambda c: c.mem.reload(cast(Any, 5.0)),
        InvalidOffloadId,
        "must be the number in an offload tag",
    ),
    Case(
        "reload_unknown_handle",
        lambda c: c.mem.reload(5),
        OffloadNotFound,
        "no offloaded context",
    ),
    Case("reload_zero_handle", lambda c: c.mem.reload(0), InvalidOffloadId, "positive number"),
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
        "misspelt_config_field",
        lambda c: AutoContextConfig(max_token=16_000),  # type: ignore[call-arg]
        ConfigError,
        "did you mean 'max_tokens'",
    ),
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
    assert MARKER not in str(info.value), "the error repeats message content"
    assert _picture(ctx) == before, "the failing call stored something"
    # The session still opens (through a fresh client: a new pool) and is whole.
    with AutoContextClient(ctx.db_url) as fresh:
        again = fresh.open(ctx.mem.session_id, create=False)
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
    (back,) = ctx.mem._store.load_messages([cast(int, stored.id)]).values()
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
    AutoContextClient.close_shared(db_url)


def test_developer_role_is_accepted_as_system(ctx: Ctx) -> None:
    (stored,) = ctx.mem.add({"role": "developer", "content": "Be terse."})
    assert stored.role == "system"
    assert ctx.mem.to_openai()[-1] == {"role": "developer", "content": "Be terse."}


@dataclass(frozen=True)
class Reply:
    """A bad `context_reload` call: answered with a text that explains it, never raised."""

    name: str
    call: Callable[[AutoContextMemory], str]
    #: A fragment of the answer that names the problem (case-insensitive).
    fragment: str


def _reload_call(arguments: Any) -> dict[str, Any]:
    return {
        "id": "call_r",
        "type": "function",
        "function": {"name": "context_reload", "arguments": arguments},
    }


SOME_UUID = "123e4567-e89b-12d3-a456-426614174000"

REPLIES: list[Reply] = [
    Reply(
        "arguments_none",
        lambda m: m.handle_tool_call(_reload_call(cast(Any, None))),
        "got NoneType",
    ),
    Reply(
        "arguments_a_number", lambda m: m.handle_tool_call(_reload_call(cast(Any, 3))), "got int"
    ),
    Reply(
        "arguments_a_list",
        lambda m: m.handle_tool_call(_reload_call(cast(Any, [MARKER]))),
        "got list",
    ),
    Reply(
        "arguments_nested_100k_deep",
        lambda m: m.handle_tool_call(_reload_call('{"a":' * 100_000 + "1" + "}" * 100_000)),
        "nested far too deep",
    ),
    Reply(
        "reload_arguments_with_nan",
        lambda m: m.handle_tool_call(_reload_call(f'{{"note": "{MARKER}", "uuid": NaN}}')),
        "NaN and Infinity are not JSON",
    ),
    Reply(
        "offset_infinity",
        lambda m: m.handle_tool_call(
            _reload_call(f'{{"uuid": "{SOME_UUID}", "offset": Infinity}}')
        ),
        "NaN and Infinity are not JSON",
    ),
    Reply(
        "uuid_a_number", lambda m: m.handle_tool_call(_reload_call({"uuid": 5})), "must be a string"
    ),
    Reply(
        "offload_a_float",
        lambda m: m.handle_tool_call(_reload_call({"offload": 1.5})),
        "must be an integer",
    ),
    Reply(
        "offload_and_uuid",
        lambda m: m.handle_tool_call(_reload_call({"offload": 1, "uuid": str(uuid.uuid4())})),
        "not both",
    ),
    Reply("call_none", lambda m: m.handle_tool_call(None), "Unknown tool"),
    Reply("call_a_number", lambda m: m.handle_tool_call(3), "Unknown tool"),
    Reply(
        "call_arguments_none",
        lambda m: m.handle_tool_call(_reload_call(None)),
        "got NoneType",
    ),
    Reply(
        "call_arguments_an_int",
        lambda m: m.handle_tool_call(_reload_call(7)),
        "got int",
    ),
    Reply(
        "call_arguments_a_list",
        lambda m: m.handle_tool_call(_reload_call([MARKER])),
        "got list",
    ),
    Reply(
        "call_arguments_nested_100k_deep",
        lambda m: m.handle_tool_call(_reload_call("[" * 100_000 + "]" * 100_000)),
        "nested far too deep",
    ),
    Reply(
        "call_arguments_with_nan",
        lambda m: m.handle_tool_call(_reload_call(f'{{"uuid": "{MARKER}", "offset": NaN}}')),
        "NaN and Infinity are not JSON",
    ),
    Reply(
        "tool_use_block_arguments_none",
        lambda m: m.handle_tool_call(ToolUseBlock("c", "context_reload", cast(Any, None))),
        "got NoneType",
    ),
]


@pytest.mark.parametrize("reply", REPLIES, ids=[r.name for r in REPLIES])
def test_a_bad_reload_call_is_answered_not_raised(reply: Reply, ctx: Ctx) -> None:
    before = _picture(ctx)
    answer = reply.call(ctx.mem)
    assert isinstance(answer, str)
    assert reply.fragment.lower() in answer.lower(), answer[:500]
    assert MARKER not in answer, "the answer repeats the call's arguments"
    assert _picture(ctx) == before, "answering a bad call changed the session"
