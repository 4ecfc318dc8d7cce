"""The official `openai` client's own objects are taken wherever a dict is (issue: `mem.add(
response.choices[0].message)` was refused, `handle_tool_call(message.tool_calls[0])` raised).

The objects are built by the client from real responses of the local OpenAI-protocol server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import openai
import pytest

from autoctx import AutoContextMemory
from autoctx._tools import NOT_FOUND_ANSWER
from tests.openai_server import OpenAIServer, Reply

Open = Callable[..., AutoContextMemory]


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


def _ask(server: OpenAIServer, reply: Reply) -> openai.types.chat.ChatCompletionMessage:
    server.script(reply)
    client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    response = client.chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": "go"}]
    )
    return response.choices[0].message


def test_a_response_message_and_its_tool_call_are_taken_losslessly(
    open_memory: Open, server: OpenAIServer
) -> None:
    mem = open_memory()
    question = {"role": "user", "content": "read a.py"}
    calling = _ask(server, Reply.tool_call("read_file", {"path": "a.py"}, call_id="call_7"))
    answer = _ask(server, Reply.text("a.py defines main()"))
    assert isinstance(calling, openai.types.chat.ChatCompletionMessage)

    mem.add(question)
    mem.add(calling)  # one object
    mem.add([{"role": "tool", "tool_call_id": "call_7", "content": "def main(): ..."}, answer])

    stored = mem.to_openai()
    assert stored[1] == calling.model_dump(mode="json", exclude_none=True)
    assert stored[1]["tool_calls"][0]["function"] == {
        "name": "read_file",
        "arguments": '{"path": "a.py"}',
    }
    assert stored[3] == answer.model_dump(mode="json", exclude_none=True)
    # What the client makes of the stored message is the object it came from.
    assert openai.types.chat.ChatCompletionMessage.model_validate(stored[1]) == calling


def test_a_reload_call_object_is_answered(open_memory: Open, server: OpenAIServer) -> None:
    mem = open_memory()
    unknown = "0b6e4a52-6a3c-4d7e-9a55-3f1f7c0e2d11"
    message = _ask(server, Reply.tool_call("context_reload", {"uuid": unknown}, call_id="call_r"))
    assert message.tool_calls is not None
    answer = mem.handle_tool_call(message.tool_calls[0])
    assert answer == NOT_FOUND_ANSWER
    other = _ask(server, Reply.tool_call("read_file", {"path": "a.py"}))
    assert other.tool_calls is not None
    assert "context_reload" in mem.handle_tool_call(other.tool_calls[0])
