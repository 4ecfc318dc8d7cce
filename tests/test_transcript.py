"""The plain-text transcript, the offload tag, the plan hint and the prompts (no network)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoctx import (
    AutoContextConfig,
    AutoContextError,
    ConfigError,
    InvalidPlan,
    Msg,
    OpaqueBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from autoctx._agent_plan import plan_hint, validate_plan
from autoctx._prompts import DEFAULT_PROMPTS, RELOAD_SNIPPET, build_request, clip_for, prompt_for
from autoctx._strategies.registry import LLM_STRATEGIES
from autoctx._tags import OFFLOAD_TAG_RE, TAG_TOKENS, neutralize_tags, offload_tag, tag_ids
from autoctx._tokens import get_encoding
from autoctx._transcript import Clip, clip_middle, original_chars, render_transcript

UUID = "3f1c2b9e-8d4a-4c6e-9b7f-1a2b3c4d5e6f"
#: The tag of sessions written before handles, which must still be recognized everywhere.
OLD_TAG = f"<!-- CONTEXT_OFFLOAD: uuid={UUID} -->"


def _conversation() -> list[Msg]:
    return [
        Msg.system("You are a coding agent."),
        Msg.user("Fix the failing test."),
        Msg.assistant(
            "Let me look.",
            [
                ToolUseBlock("call_1", "read_file", json.dumps({"path": "a.py"})),
                ToolUseBlock("call_2", "run", '{"cmd": "pytest -x"}'),
            ],
        ),
        Msg.tool("call_1", "def f():\n    return 1", "read_file"),
        Msg.tool("call_2", "", "run"),
        Msg.assistant("The test passes now.", name="coder"),
    ]


# ---------------------------------------------------------------------------------------------
# render_transcript
# ---------------------------------------------------------------------------------------------


def test_transcript_lines() -> None:
    text = render_transcript(_conversation())
    assert text == (
        "[system] You are a coding agent.\n\n"
        "[user] Fix the failing test.\n\n"
        "[assistant] Let me look.\n"
        '[assistant -> tool call read_file id=call_1] {"path": "a.py"}\n'
        '[assistant -> tool call run id=call_2] {"cmd": "pytest -x"}\n\n'
        "[tool result read_file id=call_1] def f():\n    return 1\n\n"
        "[tool result run id=call_2] (empty output)\n\n"
        "[assistant (coder)] The test passes now."
    )


def test_transcript_never_holds_raw_openai_messages() -> None:
    text = render_transcript(_conversation())
    assert '"role"' not in text
    assert "tool_calls" not in text
    assert "tool_call_id" not in text


def test_transcript_several_results_in_one_message_and_parts_output() -> None:
    msg = Msg(
        "tool",
        (
            ToolResultBlock("c1", (TextBlock("part one, "), TextBlock("part two")), "grep"),
            ToolResultBlock("c2", "second", ""),
        ),
    )
    assert render_transcript([msg]) == (
        "[tool result grep id=c1] part one, part two\n[tool result unknown tool id=c2] second"
    )


def test_transcript_opaque_blocks_and_kinds() -> None:
    msg = Msg(
        "user",
        (
            TextBlock("look at this: "),
            OpaqueBlock({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}}),
            OpaqueBlock({"type": "input_audio", "input_audio": {"data": "xx"}}),
            OpaqueBlock({"type": "thinking", "thinking": "hmm"}),
            OpaqueBlock({"no_type": 1}),
        ),
    )
    assert render_transcript([msg]) == (
        "[user] look at this: [image][audio][opaque: thinking][opaque: unknown]"
    )
    assert "base64" not in render_transcript([msg])
    summary = Msg.assistant("I read a.py.", kind="current_round_summary")
    assert render_transcript([summary]) == (
        "[assistant, earlier current round summary] I read a.py."
    )
    assert render_transcript([Msg("assistant", ())]) == "[assistant] (no content)"


def test_transcript_keeps_exact_arguments() -> None:
    args = '{ "path" : "src/x.py",  "lines": [1, 2] }'
    text = render_transcript([Msg.assistant(None, [ToolUseBlock("id9", "read", args)])])
    assert text == f"[assistant -> tool call read id=id9] {args}"
    empty = render_transcript([Msg.assistant(None, [ToolUseBlock("id9", "now", "")])])
    assert empty == "[assistant -> tool call now id=id9] (no arguments)"


def test_transcript_neutralizes_tags_unless_asked() -> None:
    summary = Msg.assistant(f"I fixed a.py.\n{offload_tag(12)}", kind="tool_run_summary")
    old = Msg.assistant(f"I read b.py.\n{OLD_TAG}", kind="tool_run_summary")
    text = render_transcript([summary, old])
    assert "CONTEXT_OFFLOAD" not in text
    assert "<!--" not in text
    assert "[offloaded context 12]" in text
    assert f"[offloaded context {UUID}]" in text
    kept = render_transcript([summary, old], keep_tags=True)
    assert offload_tag(12) in kept and OLD_TAG in kept


def _long_output(lines: int = 200) -> str:
    return "\n".join(f"line {n:04d}: value={n * 7}" for n in range(lines))


def test_clip_middle_keeps_head_and_tail_and_says_what_was_left_out() -> None:
    text = _long_output()
    cut = clip_middle(text, 500)
    head, note, tail = cut.split("\n[TRUNCATED: ")[0], cut, cut.rsplit("]\n", 1)[1]
    assert text.startswith(head) and text.endswith(tail)
    assert len(head) + len(tail) == 500
    left_out = len(text) - 500
    assert f"[TRUNCATED: {left_out} characters left out here;" in note
    assert len(cut) < len(text) // 5
    # Short enough, or a cut that would save less than its note: the text whole.
    assert clip_middle(text, None) == text
    assert clip_middle(text, len(text)) == text
    assert clip_middle(text, len(text) - 20) == text


def test_transcript_clips_long_tool_outputs_and_arguments_only_when_asked() -> None:
    body = _long_output()
    args = json.dumps({"path": "big.txt", "content": _long_output(100)})
    msgs = [
        Msg.user("Write it. " + "x" * 900),
        Msg.assistant(None, [ToolUseBlock("call_1", "write_file", args)]),
        Msg.tool("call_1", body, "write_file"),
        Msg.assistant("Short answer."),
    ]
    whole = render_transcript(msgs)
    assert body in whole and args in whole and "TRUNCATED" not in whole
    clipped = render_transcript(msgs, clip=Clip(tool_chars=400, text_chars=5000))
    assert body not in clipped and args not in clipped
    assert clipped.count("[TRUNCATED: ") == 2
    assert "[tool result write_file id=call_1] line 0000: value=0" in clipped
    assert body.rsplit("\n", 1)[1] in clipped  # the output's last line
    assert "x" * 900 in clipped and "Short answer." in clipped  # text under its own limit
    assert len(clipped) < len(whole) - 5_000
    # The text limit cuts a message's own text.
    assert "x" * 900 not in render_transcript(msgs, clip=Clip(text_chars=300))


def test_a_total_clip_cuts_the_longest_originals_to_one_length_and_keeps_summaries() -> None:
    earlier = Msg.assistant("Earlier history: " + "s" * 3_000, kind="history_summary")
    msgs = [earlier, Msg.user("Short request.")]
    for k in range(6):
        msgs.append(Msg.assistant(f"Answer {k}: " + "a" * (1_000 * (k + 1))))
    whole = render_transcript(msgs)
    clipped = render_transcript(msgs, clip=Clip(total_chars=9_000))
    assert len(clipped) <= 9_000 + 6 * 120 < len(whole)  # each cut adds its note
    assert earlier.text in clipped and "Short request." in clipped  # summaries, short ones
    answers = [line for line in clipped.split("\n\n") if line.startswith("[assistant] Answer")]
    cut = [a for a in answers if "[TRUNCATED: " in a]
    assert cut and not any("[TRUNCATED: " in a for a in answers[: len(answers) - len(cut)])
    # The cut ones keep one common length (head and tail), the short ones stay whole.
    lengths = {len(a.split("\n")[0]) + len(a.rsplit("\n", 1)[1]) for a in cut}
    assert max(lengths) - min(lengths) <= 12, lengths
    # A transcript that fits is not touched.
    assert render_transcript(msgs, clip=Clip(total_chars=len(whole) + 100)) == whole


def test_a_clip_never_cuts_an_offload_tag_in_half() -> None:
    for tag in (offload_tag(123456), OLD_TAG):
        output = "a" * 300 + tag + "b" * 300
        clipped = render_transcript([Msg.tool("c", output, "grep")], clip=Clip(tool_chars=320))
        assert "CONTEXT_OFFLOAD" not in clipped and "<!--" not in clipped


def test_requests_are_clipped_per_strategy_and_keep_the_original_size() -> None:
    config = AutoContextConfig(max_tokens=32_000)
    assert config.transcript_clip_chars == config.large_payload_chars // 10 == 512
    body = _long_output(2000)  # about 47,000 characters
    msgs = [
        Msg.assistant(None, [ToolUseBlock("call_1", "grep", "{}")]),
        Msg.tool("call_1", body, "grep"),
    ]
    for strategy in (1, 4, 6, 7):
        request = build_request(strategy, msgs, clip=clip_for(strategy, config))
        assert body not in request.transcript and "[TRUNCATED: " in request.transcript
        assert len(request.transcript) < 1_000
        # The original size (S6's budget is a share of it) is what the range holds.
        assert request.input_chars == original_chars(msgs)
        assert "[TRUNCATED: ...]" in request.prompt  # the prompt says what the cut means
    # S5 summarizes one large message: it sees up to four times the large threshold of it.
    s5 = build_request(5, msgs, clip=clip_for(5, config))
    assert 4 * config.large_payload_chars <= len(s5.transcript) < len(body)
    assert clip_for(5, config) == Clip(20_480, 20_480)
    assert clip_for(7, AutoContextConfig(transcript_clip_chars=2_000)).tool_chars == 2_000
    # The fold reads at most four times what it may write.
    assert clip_for(7, config).total_chars == 4 * 3 * config.fold_budget_tokens
    assert clip_for(1, config).total_chars is None
    # Without a clip (a caller's own use, the reload tool) the transcript is whole.
    assert body in build_request(7, msgs).transcript


def test_original_chars_counts_payloads() -> None:
    msgs = _conversation()
    assert original_chars(msgs) == sum(m.payload_chars for m in msgs)
    assert original_chars([Msg.user("abc"), Msg.tool("c", "12345", "t")]) == 8
    assert original_chars([]) == 0


_texts = st.text(max_size=80)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool"]), _texts), max_size=6))
def test_transcript_property_no_marker_and_sizes(items: list[tuple[str, str]]) -> None:
    msgs: list[Msg] = []
    for i, (role, text) in enumerate(items):
        old = f"<!-- CONTEXT_OFFLOAD: uuid={i} -->"
        payload = f"{text}{old}{text}CONTEXT_OFFLOAD{offload_tag(i)}"
        if role == "tool":
            msgs.append(Msg.tool(f"c{i}", payload, "t"))
        elif role == "assistant":
            msgs.append(Msg.assistant(payload, [ToolUseBlock(f"c{i}", "t", json.dumps(text))]))
        else:
            msgs.append(Msg.user(payload))
    rendered = render_transcript(msgs)
    assert "CONTEXT_OFFLOAD" not in rendered
    assert OFFLOAD_TAG_RE.search(rendered) is None
    assert original_chars(msgs) == sum(m.payload_chars for m in msgs)


# ---------------------------------------------------------------------------------------------
# Tag
# ---------------------------------------------------------------------------------------------


def test_offload_tag_format_and_regex() -> None:
    tag = offload_tag(12)
    assert tag == "<!-- offload 12 -->"
    match = OFFLOAD_TAG_RE.search(f"summary text\n{tag}")
    assert match is not None and match.group("handle") == "12" and match.group("uuid") is None
    # A model that copies a tag rarely copies its spacing, case or separator.
    for loose in ("<!--offload 12-->", "<!-- Offload #12 -->", "<!--  OFFLOAD:12 -->"):
        found = OFFLOAD_TAG_RE.search(loose)
        assert found is not None and found.group("handle") == "12", loose
    # The tag of sessions written before handles is still a tag.
    old = OFFLOAD_TAG_RE.search(f"summary text\n{OLD_TAG}")
    assert old is not None and old.group("uuid") == UUID and old.group("handle") is None
    loose_old = OFFLOAD_TAG_RE.search(f"<!--CONTEXT_OFFLOAD:uuid={UUID}-->")
    assert loose_old is not None and loose_old.group("uuid") == UUID
    assert tag_ids(f"a {OLD_TAG} b {tag}") == [UUID, "12"]
    for not_a_tag in ("<!-- a comment -->", "<!-- offload -->", "offload 12", "[offload 12]"):
        assert OFFLOAD_TAG_RE.search(not_a_tag) is None, not_a_tag


def test_the_tag_costs_at_most_eight_tokens() -> None:
    """The tag the model sees, with the newline before it, in both encodings, for handles up
    to a million: the estimate every planner uses (`TAG_TOKENS`) holds, and the tag stays
    within the 8 tokens the design allows (the uuid tag cost 45)."""
    samples = [*range(1, 2_000), *range(2_000, 1_000_000, 997), 999_999]
    for name in ("o200k_base", "cl100k_base"):
        encoding = get_encoding(name)
        assert len(encoding.encode("\n" + OLD_TAG)) >= 40
        for handle in samples:
            alone = len(encoding.encode(offload_tag(handle)))
            after_text = len(encoding.encode(f"...\n{offload_tag(handle)}")) - len(
                encoding.encode("...")
            )
            assert alone <= 8 and after_text <= TAG_TOKENS <= 8, (name, handle)


def test_neutralize_tags() -> None:
    assert neutralize_tags("plain") == "plain"
    assert neutralize_tags(f"x {offload_tag(7)} y") == "x [offloaded context 7] y"
    assert neutralize_tags(f"x {OLD_TAG} y") == f"x [offloaded context {UUID}] y"
    assert "CONTEXT_OFFLOAD" not in neutralize_tags("a CONTEXT_OFFLOAD b")
    assert neutralize_tags("<!-- a comment -->") == "<!-- a comment -->"


# ---------------------------------------------------------------------------------------------
# Plan
# ---------------------------------------------------------------------------------------------

PLAN: dict[str, Any] = {
    "goal": "Ship the parser fix",
    "steps": [
        {"title": "Reproduce the bug", "state": "done"},
        {"title": "Write the failing test", "state": "done"},
        {"title": "Patch parse()", "state": "in_progress"},
        {"title": "Run the full suite", "state": "pending"},
        {"title": "Open the PR", "state": "pending"},
    ],
    "expected_outcome": "All tests green, PR open",
}


def test_validate_plan_normalizes() -> None:
    assert validate_plan(PLAN) == PLAN
    assert validate_plan({"goal": "g"}) == {"goal": "g", "steps": [], "expected_outcome": ""}
    assert validate_plan({"goal": "g", "steps": [{"title": "t"}]})["steps"] == [
        {"title": "t", "state": "pending"}
    ]


@pytest.mark.parametrize(
    ("plan", "fragment"),
    [
        ({}, "goal"),
        ({"goal": "  "}, "goal"),
        ({"goal": 3}, "goal"),
        ({"goal": "g", "step": []}, "unknown keys"),
        ({"goal": "g", "steps": "do it"}, "steps"),
        ({"goal": "g", "steps": ["do it"]}, "steps'][0]"),
        ({"goal": "g", "steps": [{"title": ""}]}, "title"),
        ({"goal": "g", "steps": [{"title": "t", "state": "started"}]}, "in_progress"),
        ({"goal": "g", "steps": [{"title": "t", "done": True}]}, "unknown keys"),
        ({"goal": "g", "expected_outcome": 5}, "expected_outcome"),
    ],
)
def test_validate_plan_refuses(plan: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InvalidPlan, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        validate_plan(plan)


def test_invalid_plan_is_an_autoctx_value_error() -> None:
    assert issubclass(InvalidPlan, AutoContextError)
    assert issubclass(InvalidPlan, ValueError)
    with pytest.raises(InvalidPlan):
        validate_plan(["not", "a", "mapping"])  # type: ignore[arg-type]


def test_plan_hint() -> None:
    assert plan_hint(None) is None
    hint = plan_hint(PLAN)
    assert hint is not None
    lines = hint.splitlines()
    assert "Goal: Ship the parser fix" in lines
    assert "Progress: 2 of 5 steps done" in lines
    assert "In progress: Patch parse()" in lines
    assert "Next: Run the full suite" in lines
    assert "Expected outcome: All tests green, PR open" in lines
    # Short: done steps and later pending steps are not listed.
    assert "Reproduce the bug" not in hint and "Open the PR" not in hint
    assert (
        plan_hint({"goal": "g"})
        == "Plan of this session (keep what the remaining work needs):\nGoal: g"
    )


def test_plan_hint_clips_long_fields_and_tags() -> None:
    hint = plan_hint({"goal": "x" * 5000 + offload_tag(3)})
    assert hint is not None
    assert len(hint) < 500
    assert "CONTEXT_OFFLOAD" not in (plan_hint({"goal": f"g {OLD_TAG}"}) or "")
    assert OFFLOAD_TAG_RE.search(plan_hint({"goal": f"g {offload_tag(3)}"}) or "") is None
    with pytest.raises(InvalidPlan):
        plan_hint({"goal": ""})


# ---------------------------------------------------------------------------------------------
# Prompts and requests
# ---------------------------------------------------------------------------------------------


def test_default_prompts_cover_the_llm_strategies() -> None:
    assert set(DEFAULT_PROMPTS) == set(LLM_STRATEGIES) == {1, 4, 5, 6, 7}
    for prompt in DEFAULT_PROMPTS.values():
        assert "<!--" not in prompt
        assert "CONTEXT_OFFLOAD" not in prompt
        assert "plain text" in prompt.lower()
    assert "[TRUNCATED]" in DEFAULT_PROMPTS[1]
    assert "count" in DEFAULT_PROMPTS[1]
    assert "status codes" in DEFAULT_PROMPTS[4] and "narrate" in DEFAULT_PROMPTS[4]
    assert "conservative" in DEFAULT_PROMPTS[5].lower()
    assert "first person" in DEFAULT_PROMPTS[6] and "I called" in DEFAULT_PROMPTS[6]
    assert "character budget" in DEFAULT_PROMPTS[6]
    fold = DEFAULT_PROMPTS[7]
    assert "goals" in fold and "decisions" in fold.lower() and "length budget" in fold
    assert "offloaded context" in fold and "still open" in fold


def test_prompt_for_overrides() -> None:
    assert prompt_for(4) == DEFAULT_PROMPTS[4]
    assert prompt_for(4, {4: "mine"}) == "mine"
    assert prompt_for(1, {4: "mine"}) == DEFAULT_PROMPTS[1]
    assert prompt_for(7, {7: "my fold"}) == "my fold"
    for strategy in (0, 2, 3, 8):
        with pytest.raises(ConfigError, match="no prompt"):
            prompt_for(strategy)


def test_build_request() -> None:
    msgs = _conversation()[1:]
    request = build_request(6, msgs, prompts={6: "custom"}, char_budget=120, plan=PLAN)
    assert request.strategy == 6
    assert request.prompt == "custom"
    assert request.transcript == render_transcript(msgs)
    assert request.input_chars == original_chars(msgs)
    assert request.char_budget == 120
    assert request.plan_hint == plan_hint(PLAN)
    plain = build_request(1, msgs)
    assert plain.prompt == DEFAULT_PROMPTS[1]
    assert plain.char_budget is None and plain.plan_hint is None
    with pytest.raises(ValueError, match="char_budget"):
        build_request(6, msgs, char_budget=0)
    with pytest.raises(InvalidPlan):
        build_request(6, msgs, plan={"goal": ""})
    fold = build_request(7, msgs, token_budget=500)
    assert fold.prompt == DEFAULT_PROMPTS[7] and fold.token_budget == 500
    with pytest.raises(ValueError, match="token_budget"):
        build_request(7, msgs, token_budget=0)


def test_the_fold_request_states_its_token_budget_before_the_plan() -> None:
    request = build_request(7, _conversation()[1:], token_budget=432, plan=PLAN)
    content = request.user_content()
    hint = plan_hint(PLAN)
    assert hint is not None and content.endswith(hint)
    assert content.index(request.transcript) < content.index("at most 432 tokens")
    assert content.index("at most 432 tokens") < content.index(hint)


def test_user_content_order_plan_last() -> None:
    request = build_request(6, _conversation()[1:], char_budget=321, plan=PLAN)
    content = request.user_content()
    hint = plan_hint(PLAN)
    assert hint is not None
    assert content.startswith("Transcript to summarize:\n\n[user] Fix the failing test.")
    assert content.endswith(hint)
    assert content.index(request.transcript) < content.index("at most 321 characters")
    assert content.index("at most 321 characters") < content.index(hint)
    no_extras = build_request(1, _conversation()[1:]).user_content()
    assert no_extras == "Transcript to summarize:\n\n" + render_transcript(_conversation()[1:])


def test_reload_snippet() -> None:
    assert "context_reload" in RELOAD_SNIPPET
    assert "<!-- offload N -->" in RELOAD_SNIPPET
