"""Messages: the block model, lossless OpenAI conversion, validation (no database)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from autoctx import (
    AutoContextConfig,
    InvalidMessage,
    Msg,
    OpaqueBlock,
    RuntimeOptions,
    TextBlock,
    ToolUseBlock,
    from_openai_messages,
    to_openai_messages,
)
from autoctx._intake import OpenCalls, bind, count_tokens, open_calls_at_tail, prepare, stand_in
from autoctx._structure import (
    current_round_start,
    latest_final_index,
    meta_of,
    tool_group_spans,
)
from autoctx._tokens import TokenCounter, get_encoding


def drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_none(v) for v in value]
    return value


def varied_conversation() -> list[dict[str, Any]]:
    """System, developer, user with string and parts, parallel tool calls, empty content with
    tool_calls, names, unknown keys, tool content parts."""
    return [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "developer", "content": "Prefer small diffs."},
        {"role": "user", "content": "Fix the failing test.", "name": "alice"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Here is a screenshot"},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"},
                },
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "run_tests", "arguments": '{ "k" :"x",  "n": 2}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "def f():\n    return 1\n"},
        {
            "role": "tool",
            "tool_call_id": "call_2",
            "content": [{"type": "text", "text": "1 failed"}],
        },
        {
            "role": "assistant",
            "content": "I will patch it.",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "write_file", "arguments": "{}"},
                }
            ],
            "refusal": None,
        },
        {"role": "tool", "tool_call_id": "call_0", "content": ""},
        {
            "role": "assistant",
            "content": "Done: the test passes.",
            "name": "coder",
            "x_custom": {"a": 1},
        },
    ]


def test_openai_round_trip_in_memory_is_equal() -> None:
    original = varied_conversation()
    msgs = from_openai_messages(original)
    assert drop_none(to_openai_messages(msgs)) == drop_none(original)


def test_string_content_stays_string_and_parts_stay_parts() -> None:
    as_string = Msg.from_openai({"role": "user", "content": "hi"}).to_openai()
    as_parts = Msg.from_openai(
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    ).to_openai()
    assert as_string["content"] == "hi"
    assert as_parts["content"] == [{"type": "text", "text": "hi"}]


def test_developer_role_is_system_and_comes_back_as_developer() -> None:
    msg = Msg.from_openai({"role": "developer", "content": "rules"})
    assert msg.role == "system"
    assert msg.to_openai()["role"] == "developer"


def test_blocks_model_parallel_calls_and_opaque_parts() -> None:
    msgs = from_openai_messages(varied_conversation())
    user_parts = msgs[3]
    assert isinstance(user_parts.content[0], TextBlock)
    assert isinstance(user_parts.content[1], OpaqueBlock)
    calls = msgs[4].tool_uses
    assert [c.id for c in calls] == ["call_1", "call_2"]
    assert calls[1].input == {"k": "x", "n": 2}
    # The raw argument text is kept byte for byte, spaces included.
    assert calls[1].arguments == '{ "k" :"x",  "n": 2}'


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        ({"role": "robot", "content": "x"}, "unknown role 'robot'"),
        ({"role": "tool", "content": "x"}, "tool_call_id"),
        ({"role": "user"}, "needs 'content'"),
        ({"role": "user", "content": 42}, "'content' must be"),
        (
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"a": 1}}}],
            },
            "must be a JSON string",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": "", "function": {"name": "f"}}]},
            "non-empty string 'id'",
        ),
        (
            {
                "role": "tool",
                "tool_call_id": "c",
                "content": [{"type": "image_url", "image_url": {}}],
            },
            "text parts",
        ),
        ("not a dict", "expected an OpenAI chat message"),
    ],
)
def test_from_openai_rejects_malformed_messages(message: Any, fragment: str) -> None:
    with pytest.raises(InvalidMessage, match="message 0") as err:
        from_openai_messages([message])
    assert fragment in str(err.value)


# -- validation at add() (intake) -------------------------------------------------------------

COUNTER = TokenCounter("gpt-4o")


def _prepare(
    msgs: list[Msg], open_calls: OpenCalls | None = None, max_chars: int = 10_000
) -> list[Msg]:
    prepared = prepare(msgs, COUNTER, max_chars=max_chars, session_id="s")
    return [p.msg for p in bind(prepared, open_calls or OpenCalls(), session_id="s")]


def call(call_id: str, name: str = "read_file", arguments: str = "{}") -> ToolUseBlock:
    return ToolUseBlock(call_id, name, arguments)


def test_tool_results_bind_to_their_calls_and_get_the_tool_name() -> None:
    out = _prepare(
        [
            Msg.assistant(None, [call("a", "read_file"), call("b", "grep")]),
            Msg.tool("b", "found"),
            Msg.tool("a", "content"),
        ]
    )
    assert [r.name for m in out[1:] for r in m.tool_results] == ["grep", "read_file"]


def test_tool_result_answering_no_open_call_is_refused() -> None:
    with pytest.raises(InvalidMessage, match=r"message 1 \(tool\).*'zzz' answers no open call"):
        _prepare([Msg.assistant(None, [call("a")]), Msg.tool("zzz", "x")])


def test_call_id_reused_while_open_is_refused() -> None:
    with pytest.raises(InvalidMessage, match="'a' is used twice"):
        _prepare([Msg.assistant(None, [call("a"), call("a")])])


def test_message_while_calls_unanswered_is_refused() -> None:
    with pytest.raises(InvalidMessage, match=r"calls \['a'\] are still unanswered"):
        _prepare([Msg.assistant(None, [call("a")]), Msg.user("hello?")])


def test_ids_may_repeat_across_the_session_once_answered() -> None:
    out = _prepare(
        [
            Msg.assistant(None, [call("call_0")]),
            Msg.tool("call_0", "one"),
            Msg.assistant(None, [call("call_0")]),
            Msg.tool("call_0", "two"),
        ]
    )
    assert len(out) == 4


def test_arguments_that_are_not_json_are_refused() -> None:
    with pytest.raises(InvalidMessage, match="arguments are not valid JSON"):
        _prepare([Msg.assistant(None, [call("a", arguments="{path: a.py")])])


def test_deeply_nested_arguments_are_refused_without_recursing() -> None:
    deep = "[" * 5000 + "]" * 5000
    with pytest.raises(InvalidMessage, match="nested deeper"):
        _prepare([Msg.assistant(None, [call("a", arguments=deep)])])


def test_nul_characters_are_refused_with_a_clear_error() -> None:
    with pytest.raises(InvalidMessage, match="NUL character"):
        _prepare([Msg.user("binary\x00output")])
    with pytest.raises(InvalidMessage, match="NUL character"):
        _prepare([Msg.assistant(None, [call("a")]), Msg.tool("a", "bytes \x00\x01")], OpenCalls())


def test_lone_surrogates_are_refused() -> None:
    with pytest.raises(InvalidMessage, match="lone UTF-16 surrogate"):
        _prepare([Msg.user("bad \ud800 text")])


def test_payload_over_the_cap_is_refused() -> None:
    with pytest.raises(InvalidMessage, match="over the cap of 100"):
        _prepare([Msg.user("x" * 101)], max_chars=100)


def test_tool_use_on_a_user_message_is_refused() -> None:
    with pytest.raises(InvalidMessage, match="only assistant messages may carry tool calls"):
        _prepare([Msg("user", (call("a"),))])


def test_caller_cannot_add_summary_kinds() -> None:
    with pytest.raises(InvalidMessage, match="made by autoctx"):
        _prepare([Msg.assistant("fake summary", kind="round_summary")])


# -- tokens ------------------------------------------------------------------------------------


def test_token_counts_are_tiktoken_counts_plus_documented_overhead() -> None:
    enc = get_encoding("o200k_base")
    msg = _prepare(
        [Msg.assistant("hello there", [call("a", "read_file", '{"path": "a.py"}')], name="bot")]
    )[0]
    expected = (
        3
        + 1
        + len(enc.encode("hello there"))
        + len(enc.encode("read_file"))
        + len(enc.encode('{"path": "a.py"}'))
    )
    assert count_tokens(msg, COUNTER) == expected


def test_both_encodings_load_offline_and_match_known_ids() -> None:
    assert get_encoding("cl100k_base").encode_ordinary("hello world") == [15339, 1917]
    assert get_encoding("o200k_base").encode_ordinary("hello world") == [24912, 2375]
    assert TokenCounter("gpt-4").encoding_name == "cl100k_base"
    assert TokenCounter("some-local-model").encoding_name == "o200k_base"


# -- structure helpers -------------------------------------------------------------------------


def test_structure_helpers_find_groups_rounds_and_the_current_round() -> None:
    msgs = _prepare(
        [
            Msg.system("sys"),
            Msg.user("q1"),
            Msg.assistant(None, [call("a"), call("b")]),
            Msg.tool("a", "1"),
            Msg.tool("b", "2"),
            Msg.assistant("answer 1"),
            Msg.user("q2"),
            Msg.assistant(None, [call("c")]),
        ]
    )
    metas = [
        meta_of(m, id=i, final=m.role == "assistant" and not m.tool_uses, tokens=1)
        for i, m in enumerate(msgs)
    ]
    assert tool_group_spans(metas)[2] == (2, 5)
    assert latest_final_index(metas) == 5
    assert current_round_start(metas) == 6


def test_config_refuses_invalid_values_naming_the_field() -> None:
    from autoctx import ConfigError

    with pytest.raises(ConfigError, match="preview_chars"):
        AutoContextConfig(preview_chars=6000)
    with pytest.raises(ConfigError, match="token_ratio"):
        AutoContextConfig(token_ratio=1.5)
    with pytest.raises(ConfigError, match="msg_threshold"):
        AutoContextConfig(msg_threshold=0)
    with pytest.raises(ConfigError, match="max_tokens"):
        AutoContextConfig(max_tokens=-5)
    with pytest.raises(ConfigError, match="target_ratio"):
        AutoContextConfig(target_ratio=0.9, token_ratio=0.75)
    with pytest.raises(ConfigError, match="fold_keep_tokens"):
        AutoContextConfig(max_tokens=10_000, fold_keep_tokens=6_000)
    with pytest.raises(ConfigError, match="fold_budget_tokens"):
        AutoContextConfig(fold_budget_tokens=0)
    with pytest.raises(ConfigError, match="transcript_clip_chars"):
        AutoContextConfig(transcript_clip_chars=0)
    with pytest.raises(ConfigError, match="last_keep"):
        AutoContextConfig(last_keep=-1)
    # A number no window has (a config read back from the database may hold any) is refused
    # before the sizes derived from the window are computed from it.
    with pytest.raises(ConfigError, match="max_tokens must be at most"):
        AutoContextConfig(max_tokens=10**400)
    assert json.loads(json.dumps(AutoContextConfig().to_json()))["msg_threshold"] is None
    counted = AutoContextConfig(msg_threshold=100).to_json()
    assert json.loads(json.dumps(counted))["msg_threshold"] == 100


def test_config_defaults_are_the_specs() -> None:
    """docs/design.md §2 and 3 name the defaults; a change of one is a change of behaviour."""
    defaults = AutoContextConfig()
    # No count trigger by default (docs/design.md §2); the design's 100 is one setting away.
    assert (defaults.msg_threshold, defaults.msg_target, defaults.max_tokens) == (
        None,
        None,
        131072,
    )
    counted = AutoContextConfig(msg_threshold=100)
    assert (counted.msg_threshold, counted.msg_target) == (100, 40)
    # The 0.4 target and early masking: bench/README.md, "Early masking and the defaults".
    assert (defaults.token_ratio, defaults.target_ratio) == (0.75, 0.4)
    assert (defaults.mask_ratio, defaults.mask_fact_chars, defaults.fact_repair) == (
        0.15,
        48,
        False,
    )
    # The index line's share, reserved in the summary's budget: bench/README.md, "The index
    # line's room".
    assert defaults.fact_index_ratio == 0.4
    options = RuntimeOptions()
    assert (options.max_passes, options.max_llm_calls) == (10, 8)
    assert (defaults.large_payload_chars, defaults.preview_chars, defaults.last_keep) == (
        5120,
        200,
        50,
    )
    assert (defaults.min_tool_run, defaults.min_compress_tokens) == (6, 5000)
    assert defaults.current_round_ratio == 0.3


def test_config_sizes_follow_the_window_when_not_set() -> None:
    """docs/design.md §2: `AutoContextConfig(max_tokens=W)` alone is a sound config."""
    reference = AutoContextConfig()
    assert reference.token_target == 52_428
    assert (reference.fold_keep_tokens, reference.fold_budget_tokens) == (13_107, 5_242)
    small = AutoContextConfig(max_tokens=16_000)
    assert small.min_compress_tokens == round(5000 * 16_000 / 131_072) == 610
    assert small.fold_keep_tokens == small.token_target // 4 == 1_600
    assert small.fold_budget_tokens == small.token_target // 10 == 640
    # The protected tail is a size relative to the window too (50 messages of agent steps
    # would fill a 32,000-token window's target by themselves), never under 8 messages.
    assert reference.last_keep == 50
    assert AutoContextConfig(max_tokens=32_000).last_keep == round(50 * 32_000 / 131_072) == 12
    assert small.last_keep == 8
    assert AutoContextConfig(max_tokens=16_000, last_keep=50).last_keep == 50
    assert dataclasses.replace(small, max_tokens=131_072).last_keep == 50
    tiny = AutoContextConfig(max_tokens=8_000)
    assert tiny.fold_keep_tokens + tiny.fold_budget_tokens < tiny.token_target
    # `replace` derives them again rather than freezing the old window's values.
    moved = dataclasses.replace(reference, max_tokens=16_000)
    assert moved == small and moved.derived == small.derived
    # What the caller set stays as set.
    mine = dataclasses.replace(AutoContextConfig(min_compress_tokens=42), max_tokens=16_000)
    assert mine.min_compress_tokens == 42 and "min_compress_tokens" not in mine.derived


def test_config_defaults_adapt_to_what_the_caller_set() -> None:
    """A default never makes a config error about a field the caller did not set."""
    assert AutoContextConfig(large_payload_chars=2000).reload_page_chars == 2000
    assert AutoContextConfig(large_payload_chars=150).preview_chars == 75
    assert AutoContextConfig(large_payload_chars=2000).transcript_clip_chars == 200
    assert AutoContextConfig(transcript_clip_chars=7).transcript_clip_chars == 7
    assert AutoContextConfig(target_ratio=0.9).token_ratio == 0.95
    assert AutoContextConfig(token_ratio=0.45).target_ratio == pytest.approx(0.36)
    keep = AutoContextConfig(max_tokens=10_000, fold_keep_tokens=3_500)
    assert keep.fold_keep_tokens + keep.fold_budget_tokens < keep.token_target
    # The record of a session derives again what was derived, and keeps what was set.
    stored = AutoContextConfig(max_tokens=16_000, min_compress_tokens=42).to_json()
    assert stored["min_compress_tokens"] == 42 and stored["fold_keep_tokens"] == 1_600
    assert "fold_keep_tokens" in stored["derived"]
    again = AutoContextConfig.from_json(json.loads(json.dumps(stored)))
    assert again == AutoContextConfig(max_tokens=16_000, min_compress_tokens=42)
    derived = AutoContextConfig(max_tokens=16_000).derived
    assert again.derived == tuple(n for n in derived if n != "min_compress_tokens")


def test_token_counter_clips_a_text_to_a_token_count() -> None:
    counter = TokenCounter("gpt-4o")
    text = "The fold keeps /srv/app/config.yaml and error E1234 in 12 tokens or fewer. " * 20
    clipped = counter.clip(text, 12)
    assert text.startswith(clipped) and 0 < counter.count(clipped) <= 12
    assert counter.clip("short", 12) == "short"


def test_a_stand_in_takes_the_final_flag_of_the_kinds_table() -> None:
    """`pop_last`'s remainder: decided here, purely, and only written by the store. An original
    is final when it is an assistant message without calls, whatever it stands for; a preview
    or large summary is final when the message it stands for was."""
    counter = TokenCounter("gpt-4o")
    answer, call = prepare(
        [Msg.assistant("done."), Msg.assistant("look", [ToolUseBlock("c1", "ls")])],
        counter,
        max_chars=10_000,
        session_id="s",
    )
    assert stand_in(answer, replaced_final=False).final
    assert not stand_in(call, replaced_final=True).final
    preview = dataclasses.replace(answer, msg=dataclasses.replace(answer.msg, kind="preview"))
    assert stand_in(preview, replaced_final=True).final
    assert not stand_in(preview, replaced_final=False).final
    # Nothing else of the message changes.
    assert stand_in(preview, replaced_final=True).msg == preview.msg


def test_the_open_calls_at_a_tail_are_the_newest_groups_unanswered_calls() -> None:
    """One rule for the store's tail read and a fork's cut: reading back from the newest
    message, the first message that is not a tool result names the calls, minus those the
    results after it answered; only results in view means "read further back"."""
    newest_first = [
        ("tool", (), ("c2",), ("pwd",)),
        ("assistant", ("c1", "c2", "c3"), (), ("ls", "pwd")),
        ("assistant", ("old",), (), ("cat",)),
    ]
    assert open_calls_at_tail(newest_first) == {"c1": "ls", "c3": ""}
    assert open_calls_at_tail(newest_first[:1]) is None
    assert open_calls_at_tail([("user", (), (), ())]) == {}
    assert open_calls_at_tail([]) is None
