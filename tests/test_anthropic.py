"""The Anthropic Messages format: `add()` takes it, `to_anthropic()` gives it back, and a long
agent loop through the official `anthropic` client against a local `/v1/messages` endpoint that
checks the API's shape rules stays under the window with every request accepted."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from autoctx import (
    AutoContextConfig,
    AutoContextMemory,
    InvalidMessage,
    Msg,
    from_anthropic_messages,
)

from . import framework_runs
from .agent_model import tool_output
from .anthropic_server import AnthropicAgent, AnthropicServer, shape_errors

if TYPE_CHECKING:
    import anthropic

Opener = Callable[..., AutoContextMemory]

PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5Er"
    "kJggg=="
)
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxN6b/+sig+\u00e9=="

#: Every block kind the format has, in the places the API puts them.
CONVERSATION: list[dict[str, Any]] = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Read a.py and b.py, then fix the failing test."},
            {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "spec text"},
                "title": "spec",
            },
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Two files.\n  Read both.", "signature": SIGNATURE},
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
            {"type": "text", "text": "Reading both."},
            {"type": "tool_use", "id": "toolu_01", "name": "read", "input": {"path": "a.py"}},
            {
                "type": "tool_use",
                "id": "toolu_02",
                "name": "read",
                "input": {"path": "b.py", "lines": [1, 2.5, None]},
                "cache_control": {"type": "ephemeral"},
            },
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "def a(): ..."},
            {
                "type": "tool_result",
                "tool_use_id": "toolu_02",
                "content": [
                    {"type": "text", "text": "no such file"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                    },
                ],
                "is_error": True,
            },
            {"type": "text", "text": "b.py was renamed to c.py."},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "toolu_03", "name": "read", "input": {"path": "c.py"}}
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_03", "is_error": False},
        ],
    },
    {"role": "assistant", "content": [{"type": "text", "text": "c.py is empty; done."}]},
    {"role": "user", "content": "Thanks."},
    {"role": "assistant", "content": "You're welcome."},
]


def test_anthropic_messages_round_trip_equal(open_memory: Opener) -> None:
    mem = open_memory()
    given = copy.deepcopy(CONVERSATION)
    mem.add([Msg.system("You fix tests."), *given])
    assert given == CONVERSATION  # add() does not change what it is given
    system, messages = mem.to_anthropic()
    assert system == "You fix tests."
    assert messages == CONVERSATION
    assert shape_errors({"model": "m", "max_tokens": 1, "messages": messages}) == []
    # A reopened memory reads the same from the database.
    again = open_memory()
    assert again.to_anthropic() == (system, messages)
    # Thinking blocks are byte-exact and in place.
    assert messages[1]["content"][0]["signature"] == SIGNATURE
    # The turn with results then text is a tool message then a user message, paired as calls.
    roles = [m.role for m in mem.messages()]
    assert roles == [
        *("system", "user", "assistant", "tool", "user", "assistant", "tool"),
        *("assistant", "user", "assistant"),
    ]
    tool = mem.messages()[3]
    assert [r.name for r in tool.tool_results] == ["read", "read"]
    assert tool.tool_results[1].is_error and tool.tool_results[1].output_text == "no such file"


def test_from_anthropic_messages_takes_a_request() -> None:
    msgs = from_anthropic_messages(CONVERSATION[:3], system="Be brief.")
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "user"]


def test_anthropic_results_pair_by_the_shape_rules(open_memory: Opener) -> None:
    mem = open_memory()
    mem.add(CONVERSATION[:2])
    before = mem.message_count()
    wrong = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_99", "content": "x"}],
    }
    with pytest.raises(InvalidMessage, match=r"toolu_99.*answers no open call"):
        mem.add(wrong)
    half = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "x"},
            {"type": "text", "text": "and then"},
        ],
    }
    with pytest.raises(InvalidMessage, match=r"toolu_02.*still unanswered"):
        mem.add(half)
    assert mem.message_count() == before


@pytest.mark.parametrize(
    ("message", "named"),
    [
        (
            {"role": "assistant", "content": [{"type": "server_tool_use", "id": "s", "name": "w"}]},
            "'server_tool_use'",
        ),
        (
            {
                "role": "user",
                "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}],
            },
            "'tool_use' is not a block of an Anthropic user message",
        ),
        (
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]},
            "'signature'",
        ),
        (
            {"role": "user", "content": [{"type": "image", "data": "x"}, {"type": "image"}]},
            "'source'",
        ),
        (
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "first"},
                    {"type": "tool_result", "tool_use_id": "t", "content": "x"},
                ],
            },
            "come first",
        ),
        (
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "audio"}]}
                ],
            },
            "'audio'",
        ),
        (
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n"}]},
            "'input' object",
        ),
        ({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}, None),
        ({"role": "user", "content": [{"type": "video", "url": "x"}]}, "'video'"),
    ],
)
def test_unknown_or_malformed_blocks_are_refused(
    open_memory: Opener, message: dict[str, Any], named: str | None
) -> None:
    mem = open_memory()
    mem.add({"role": "user", "content": "hi"})
    if named is None:  # a valid Chat Completions part: accepted, but to_anthropic() refuses it
        mem.add(message)
        with pytest.raises(InvalidMessage, match=r"'input_audio'.*to_openai"):
            mem.to_anthropic()
        return
    with pytest.raises(InvalidMessage, match=named) as info:
        mem.add(message)
    assert "message 0" in str(info.value)
    assert mem.message_count() == 1


def test_to_openai_maps_what_chat_completions_carries_and_leaves_out_the_rest(
    open_memory: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    # Before issue 32, to_openai() refused this session whole (its thinking, its document).
    mem = open_memory()
    mem.add(CONVERSATION)
    with caplog.at_level(logging.INFO, logger="autoctx"):
        out = mem.to_openai()
    # The text document is a text part; the thinking blocks are left out of the assistant
    # message, each one, and its text and calls stay in place.
    assert out[0]["content"] == [
        {"type": "text", "text": "Read a.py and b.py, then fix the failing test."},
        {"type": "text", "text": "spec text"},
    ]
    assert out[1]["content"] == "Reading both."
    assert [c["id"] for c in out[1]["tool_calls"]] == ["toolu_01", "toolu_02"]
    # A tool message holds text only: the image of the second result is left out.
    assert out[2] == {"role": "tool", "content": "def a(): ...", "tool_call_id": "toolu_01"}
    assert out[3] == {
        "role": "tool",
        "content": [{"type": "text", "text": "no such file"}],
        "tool_call_id": "toolu_02",
    }
    # One log line with the count per type, and no content.
    [line] = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert "3 block(s)" in line and "1 image, 1 redacted_thinking, 1 thinking" in line
    assert "Two files" not in line and SIGNATURE not in line
    # Nothing stored changed: the Anthropic view still gives every block back.
    assert mem.to_anthropic()[1] == CONVERSATION
    # An assistant turn of thinking and calls only becomes a message of calls (content null).
    only = open_memory("thinking-and-calls")
    only.add(
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [CONVERSATION[1]["content"][0], CONVERSATION[3]["content"][0]],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_03"}]},
        ]
    )
    out = only.to_openai()
    assert out[1]["content"] is None and out[1]["tool_calls"][0]["id"] == "toolu_03"
    # Text-only Anthropic messages convert (the calls become tool_calls, the flag is dropped).
    third = open_memory("text-only")
    third.add(
        [
            CONVERSATION[3],
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_03"}]},
        ]
    )
    out = third.to_openai()
    assert out[0]["tool_calls"][0]["function"] == {"name": "read", "arguments": '{"path":"c.py"}'}
    assert out[1] == {"role": "tool", "content": [], "tool_call_id": "toolu_03"}


def test_openai_messages_come_out_as_valid_anthropic_turns(open_memory: Opener) -> None:
    mem = open_memory()
    mem.add(
        [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "look"}]},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "one"},
            {"role": "tool", "tool_call_id": "c2", "content": "two"},
            {"role": "user", "content": "and?"},
            {"role": "assistant", "content": "done"},
        ]
    )
    system, messages = mem.to_anthropic()
    assert system == "sys"
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "look"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "c1", "name": "f", "input": {}},
                {"type": "tool_use", "id": "c2", "name": "g", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "one"},
                {"type": "tool_result", "tool_use_id": "c2", "content": "two"},
                {"type": "text", "text": "and?"},
            ],
        },
        {"role": "assistant", "content": "done"},
    ]


def test_context_tools_in_anthropic_form(open_memory: Opener) -> None:
    mem = open_memory()
    tools = mem.tools(format="anthropic")
    assert [t["name"] for t in tools] == ["context_reload", "context_search"]
    assert all(set(t) == {"name", "description", "input_schema"} for t in tools)
    assert tools[1]["input_schema"] == mem.tools()[1]["function"]["parameters"]
    mem.add({"role": "user", "content": "FACT-0042 is the answer"})
    call = {"type": "tool_use", "id": "t1", "name": "context_search", "input": {"query": "FACT"}}
    assert "FACT-0042 is the answer" in mem.handle_tool_call(call).replace("**", "")
    with pytest.raises(ValueError, match="'openai' or 'anthropic'"):
        mem.tools(format="gemini")  # type: ignore[arg-type]


WINDOW = 16_000
WORK_TOOL = {
    "name": "run_step",
    "description": "Run one step of the task.",
    "input_schema": {"type": "object", "properties": {"step": {"type": "integer"}}},
}


def _size(step: int) -> int:
    return 2_000 + (step * 7_331) % 18_001  # 2-20 KB, varying


def _run(
    client: anthropic.Anthropic,
    mem: AutoContextMemory,
    task: str,
    answers: dict[str, str],
    size: Callable[[int], int] = _size,
) -> int:
    """One agent run: the plain Messages API loop over `mem.to_anthropic()`; tool calls made."""
    mem.add({"role": "user", "content": task})
    calls = 0
    while True:
        mem.compress_if_needed()
        system, messages = mem.to_anthropic()
        response = client.messages.create(
            model="claude-test",
            max_tokens=1024,
            system=system,
            messages=messages,  # type: ignore[arg-type]
            tools=[WORK_TOOL, *mem.tools(format="anthropic")],  # type: ignore[list-item]
        )
        mem.add(response)
        uses = [b for b in response.content if b.type == "tool_use"]
        if not uses:
            return calls
        results = []
        for use in uses:
            calls += 1
            if use.name in ("context_search", "context_reload"):
                out = mem.handle_tool_call(use)
                answers[f"{use.name}:{calls}"] = out
            else:
                out = tool_output(int(use.input["step"]), size(calls))
            results.append({"type": "tool_result", "tool_use_id": use.id, "content": out})
        mem.add({"role": "user", "content": results})


def test_long_agent_loop_through_the_anthropic_client(open_memory: Opener, session_id: str) -> None:
    import anthropic

    config = AutoContextConfig(max_tokens=WINDOW)
    mem = open_memory(config=config)
    mem.add(Msg.system("You run steps with run_step and answer when done."))

    def reload_step_3() -> dict[str, Any]:
        hits = mem.search('"FACT-0003"')
        return {"message_id": hits[0].message_id}

    agent = AnthropicAgent(
        calls_per_run=44,
        context_calls={
            30: ("context_search", {"query": '"FACT-0005"'}),
            38: ("context_reload", reload_step_3),
        },
    )
    answers: dict[str, str] = {}
    with AnthropicServer(agent) as srv:
        client = anthropic.Anthropic(base_url=srv.base_url, api_key="test", max_retries=0)
        calls = _run(client, mem, "Run the 44 steps.", answers)
        assert calls == 44
        assert srv.rejected == []
        assert agent.over(WINDOW) == 0, agent.inputs
        assert len(agent.inputs) == 45
        assert agent.largest_request() > WINDOW // 2  # the loop did fill the window
        events = mem.events()
        assert events, "the run never compressed"
        # The context tools were offered and answered with the facts compression removed.
        assert "FACT-0005" in answers["context_search:31"].replace("**", "")
        assert "FACT-0003" in answers["context_reload:39"]
        for step in range(44):
            if step not in (30, 38):
                assert mem.search(f'"FACT-{step:04d}"'), step
        # A reopened session (new objects, same id) continues through the same loop.
        again = open_memory(config=config)
        agent.calls_per_run = 3
        assert _run(client, again, "Three more steps.", answers) == 3
        assert srv.rejected == []
        assert agent.over(WINDOW) == 0
        _system, messages = again.to_anthropic()
        assert messages[-1] == {
            "role": "assistant",
            "content": [{"type": "text", "text": "All steps are done."}],
        }
        print(
            f"anthropic long run: {len(agent.inputs)} requests, largest "
            f"{agent.largest_request()} / {WINDOW}, {len(events)} compressions"
        )


def test_a_long_task_at_a_small_window_sends_its_tool_results_last(open_memory: Opener) -> None:
    """S6 fires right before a request, when the context ends with the tool results the model is
    about to read: `to_anthropic()` still ends with that user turn, never with autoctx's summary
    as an assistant turn (the API would take it as a prefill and the model would continue it)."""
    import anthropic

    mem = open_memory(config=AutoContextConfig(max_tokens=framework_runs.SMALL_WINDOW))
    mem.add(Msg.system("You run steps with run_step and answer when done."))
    agent = AnthropicAgent(calls_per_run=30)
    with AnthropicServer(agent) as srv:
        client = anthropic.Anthropic(base_url=srv.base_url, api_key="test", max_retries=0)
        assert _run(client, mem, "Run the 30 steps.", {}, framework_runs.small_output_size) == 30
    assert srv.rejected == []
    assert agent.over(framework_runs.SMALL_WINDOW) == 0
    ends = [body["messages"][-1]["role"] for body in agent.requests]
    assert ends == ["user"] * 31
    framework_runs.assert_current_round_summarized(mem)
    framework_runs.assert_reachable(mem, range(30))


def test_short_runs_through_the_anthropic_client(open_memory: Opener) -> None:
    import anthropic

    config = AutoContextConfig(max_tokens=WINDOW)
    mem = open_memory(config=config)
    agent = AnthropicAgent(calls_per_run=3)
    answers: dict[str, str] = {}
    with AnthropicServer(agent) as srv:
        client = anthropic.Anthropic(base_url=srv.base_url, api_key="test", max_retries=0)
        for run in range(25):
            assert _run(client, mem, f"Run {run}: three steps.", answers) == 3
        assert srv.rejected == []
        assert agent.over(WINDOW) == 0
        assert mem.events()
        print(f"anthropic short runs: largest {agent.largest_request()} / {WINDOW}")


def test_compression_outputs_still_alternate_and_pair() -> None:
    """A fold's summary (an assistant message) opening the context, beside the assistant turn
    after it, and a previewed tool result: merged and led by a user turn."""
    from autoctx import ToolUseBlock, to_anthropic_messages

    working = [
        Msg.system("sys"),
        Msg.assistant("Summary of steps 0-9.", kind="history_summary"),
        Msg.assistant("Next.", [ToolUseBlock("t1", "run_step", '{"step":10}')]),
        Msg.tool("t1", "FACT-0010 ...\n<!--CONTEXT_OFFLOAD: x-->", kind="preview"),
        Msg.assistant("Summary of this round.", kind="current_round_summary"),
        Msg.user("Continue."),
    ]
    system, messages = to_anthropic_messages(working)
    assert system == "sys"
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[1]["content"][0] == {"type": "text", "text": "Summary of steps 0-9."}
    assert messages[1]["content"][2]["type"] == "tool_use"
    assert shape_errors({"model": "m", "max_tokens": 1, "messages": messages}) == []


def test_async_memory_speaks_anthropic(db_url: str, session_id: str) -> None:
    import asyncio

    from autoctx import AsyncAutoContextMemory, OfflineSummarizer

    async def main() -> None:
        mem = await AsyncAutoContextMemory.open(session_id, db_url, summarizer=OfflineSummarizer())
        await mem.add([Msg.system("sys"), *CONVERSATION])
        assert await mem.to_anthropic() == ("sys", CONVERSATION)
        assert [t["name"] for t in mem.tools(format="anthropic")] == [
            "context_reload",
            "context_search",
        ]
        await mem.close()

    asyncio.run(main())
