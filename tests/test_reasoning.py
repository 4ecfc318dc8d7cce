"""Reasoning kept everywhere (issue 32): a session holding a model's reasoning, in every format
autoctx stores it (Anthropic thinking and redacted thinking, Pydantic AI thinking parts, Responses
reasoning items, AgentScope thinking blocks), reads back in OpenAI format with only the reasoning
left out, and every other way (export and import, `autoctx show --json`, the console's message
page, search and reload by id) with every block as stored.

Before issue 32, `to_openai()`, `autoctx export`, `autoctx show --json` and `export_session()`
refused such a session, and the console answered HTTP 500 on the message's page."""

from __future__ import annotations

import copy
import json
import logging
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import URL
from typer.testing import CliRunner

from autoctx import (
    AutoContextClient,
    AutoContextConfig,
    AutoContextMemory,
    Msg,
    OfflineSummarizer,
    export_session,
    import_session,
)
from autoctx._cli import app
from autoctx._messages import OpaqueBlock, TextBlock, ToolUseBlock

from .conftest import _drop_database, clone_database
from .test_anthropic import CONVERSATION, SIGNATURE
from .test_console import serve

Opener = Callable[..., AutoContextMemory]

#: A Pydantic AI thinking part as its integration stores it (no signature: an OpenAI model's).
PYDANTIC_THINKING = {
    "type": "thinking",
    "thinking": "Pydantic AI thinks the cache is stale.",
    "id": "rs_1",
    "provider_name": "openai",
    "provider_details": {"effort": "low"},
}
#: A Responses API reasoning item as the Agents SDK integration stores it.
RESPONSES_REASONING = {
    "type": "reasoning",
    "id": "rs_2",
    "summary": [{"type": "summary_text", "text": "The Agents SDK model weighs the options."}],
    "encrypted_content": "gAAAAABo-encrypted",
}
#: An AgentScope thinking block as its integration stores it.
AGENTSCOPE_THINKING = {
    "agentscope": {"type": "thinking", "thinking": "AgentScope plans.", "id": "b1"},
}


def reasoning_session(mem: AutoContextMemory) -> None:
    """A session with every kind of reasoning autoctx stores, each beside the calls it led to."""
    mem.add([Msg.system("You fix tests."), *copy.deepcopy(CONVERSATION)])
    for n, block in enumerate((PYDANTIC_THINKING, RESPONSES_REASONING, AGENTSCOPE_THINKING)):
        call = ToolUseBlock(f"call_r{n}", "read", json.dumps({"path": f"r{n}.py"}))
        mem.add(Msg.user(f"Round {n}: read r{n}.py"))
        mem.add(Msg("assistant", (OpaqueBlock(block), TextBlock(f"reading r{n}"), call)))
        mem.add(Msg.tool(f"call_r{n}", f"contents of r{n}.py"))
        mem.add(Msg.assistant(f"r{n}.py is fine"))


def stored(mem: AutoContextMemory) -> list[dict[str, Any]]:
    return [m.stored_json() for m in mem.messages()]


def test_to_openai_leaves_out_each_reasoning_block_and_keeps_the_rest(
    open_memory: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    mem = open_memory()
    reasoning_session(mem)
    with caplog.at_level(logging.INFO, logger="autoctx"):
        out = mem.to_openai()
    tail = out[-12:]
    for n in range(3):
        call_message = tail[4 * n + 1]
        assert call_message["content"] == f"reading r{n}"
        assert call_message["tool_calls"][0]["id"] == f"call_r{n}"
    text = json.dumps(out)
    for secret in ("Pydantic AI thinks", "weighs the options", "AgentScope plans", SIGNATURE):
        assert secret not in text
    [line] = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    # The Anthropic turn's two thinking blocks, the image of a tool result, three reasonings.
    assert "6 block(s)" in line and "in 5 message(s)" in line
    assert "(1 image, 1 reasoning, 1 redacted_thinking, 3 thinking)" in line
    # Each stored message still holds its reasoning, byte for byte.
    blocks = [b for m in stored(mem) for b in m["content"] if b["type"] == "opaque"]
    assert {"type": "opaque", "data": PYDANTIC_THINKING} in blocks
    assert {"type": "opaque", "data": RESPONSES_REASONING} in blocks
    assert {"type": "opaque", "data": AGENTSCOPE_THINKING} in blocks


@pytest.fixture
def other_db(admin_url: URL, template_db: str) -> Iterator[str]:
    url, name = clone_database(admin_url, template_db)
    yield url.render_as_string(hide_password=False)
    AutoContextClient.close_shared(url)
    _drop_database(admin_url, name)


def test_export_and_import_keep_every_block_after_compression(
    open_memory: Opener, db_url: str, other_db: str
) -> None:
    mem = open_memory(config=AutoContextConfig(max_tokens=1_000, msg_threshold=8))
    reasoning_session(mem)
    mem.compress_if_needed()
    assert mem.events(), "the session compressed"
    document = export_session(mem.session_id, db_url)
    every = json.dumps(document["messages"], ensure_ascii=False)
    for secret in ("Pydantic AI thinks", "weighs the options", "AgentScope plans", SIGNATURE):
        assert secret in every
    import_session(json.dumps(document), other_db)
    restored = AutoContextMemory.open(
        mem.session_id, other_db, summarizer=OfflineSummarizer(), create=False
    )
    assert stored(restored) == stored(mem)
    assert restored.to_anthropic() == mem.to_anthropic()
    assert export_session(mem.session_id, other_db) == document
    # What the compression offloaded reloads with its reasoning.
    offload = next(e.offload_uuid for e in mem.events() if e.offload_uuid is not None)
    assert [m.stored_json() for m in restored.reload(offload)] == [
        m.stored_json() for m in mem.reload(offload)
    ]


def test_the_cli_shows_and_exports_a_session_with_reasoning(
    open_memory: Opener, db_url: str, tmp_path: Path
) -> None:
    mem = open_memory()
    reasoning_session(mem)
    runner = CliRunner()
    shown = runner.invoke(app, ["show", mem.session_id, "--json", "-d", db_url])
    assert shown.exit_code == 0, shown.stderr
    assert shown.stderr == ""
    messages = json.loads(shown.stdout)["messages"]
    assert [m["stored"] for m in messages] == stored(mem)
    assert messages[2]["message"]["role"] == "assistant"  # the OpenAI view, thinking left out
    assert "thinking" not in json.dumps(messages[2]["message"])
    # A tool message with two results is two OpenAI messages.
    assert [m["tool_call_id"] for m in messages[3]["message"]] == ["toolu_01", "toolu_02"]
    out = tmp_path / "s.json"
    exported = runner.invoke(app, ["export", mem.session_id, "-o", str(out), "-d", db_url])
    assert exported.exit_code == 0, exported.stderr
    assert "to_anthropic" not in exported.stderr + exported.stdout
    assert json.loads(out.read_text()) == export_session(mem.session_id, db_url)


def test_the_console_shows_a_thinking_message_whole(open_memory: Opener, db_url: str) -> None:
    mem = open_memory()
    reasoning_session(mem)
    thinking = mem.messages()[2]
    assert thinking.content[0].type == "opaque"
    with serve(db_url, None) as ui:
        sid = urllib.parse.quote(mem.session_id, safe="")
        status, body = ui.get(f"/s/{sid}/m/{thinking.id}")
    assert status == 200, body[-500:]
    # The signature and the thinking text, as stored (JSON-escaped in the page's JSON).
    assert json.dumps(SIGNATURE, ensure_ascii=False)[1:-1] in body
    assert "Two files." in body and "EmwKAhgBEgy3va3pzix/LafPsn4a" in body


def test_search_finds_a_message_with_reasoning_and_reloads_it_whole(open_memory: Opener) -> None:
    mem = open_memory()
    reasoning_session(mem)
    hits = mem.search("reading r1")
    target = next(m for m in mem.messages() if m.text == "reading r1")
    assert target.id in [h.message_id for h in hits]
    [again] = mem.reload(message_id=target.id)
    assert again.stored_json() == target.stored_json()
    assert again.content[0] == OpaqueBlock(RESPONSES_REASONING)


#: Reasoning whose words occur nowhere else, in each shape autoctx stores it, and the word of
#: each that a search finds (None: the block has no text to index).
REASONING_WORDS: list[tuple[dict[str, Any], str | None]] = [
    (
        {"type": "thinking", "thinking": "so the heron-1101 fails", "signature": "c2ln"},
        "heron-1101",
    ),
    ({"type": "redacted_thinking", "data": "ocelot-2202"}, None),
    (
        {
            "type": "reasoning",
            "id": "rs_9",
            "summary": [{"type": "summary_text", "text": "weigh the ibis-3303 first"}],
            "content": [{"type": "reasoning_text", "text": "the jacana-4404 log is long"}],
            "encrypted_content": "kiwi-5505",
        },
        "ibis-3303",
    ),
    ({"type": "reasoning", "reasoning": "then the lapwing-6606 path"}, "lapwing-6606"),
    (
        {"agentscope": {"type": "thinking", "thinking": "merlin-7707 next", "id": "b9"}},
        "merlin-7707",
    ),
]


def test_search_finds_words_that_occur_only_in_reasoning(open_memory: Opener, db_url: str) -> None:
    """Thinking blocks, reasoning items (summary and content) and LangChain's and AgentScope's
    reasoning are indexed text: a search finds a word that occurs only there, through the API
    and the CLI, and marks it in the snippet. Encrypted and redacted reasoning is not text."""
    mem = open_memory()
    ids: dict[str, int] = {}
    for n, (block, word) in enumerate(REASONING_WORDS):
        mem.add(Msg.user(f"step {n}"))
        mem.add(Msg("assistant", (OpaqueBlock(block), TextBlock(f"done {n}"))))
        if word is not None:
            ids[word] = mem.messages()[-1].id
    ids["jacana-4404"] = ids["ibis-3303"]  # the reasoning item's content text
    for word, message_id in ids.items():
        hits = mem.search(f'"{word}"')
        assert [h.message_id for h in hits] == [message_id], word
        assert f"**{word.split('-')[0]}" in hits[0].snippet, hits[0].snippet
    for word in ("ocelot-2202", "kiwi-5505"):
        assert mem.search(f'"{word}"') == [], word
    result = CliRunner().invoke(
        app, ["search", '"merlin-7707"', "--session", mem.session_id, "--json", "-d", db_url]
    )
    assert result.exit_code == 0, result.output
    assert [h["message_id"] for h in json.loads(result.stdout)] == [ids["merlin-7707"]]


def test_to_anthropic_keeps_anthropic_thinking_and_leaves_out_other_reasoning(
    open_memory: Opener,
) -> None:
    from .anthropic_server import shape_errors

    mem = open_memory()
    reasoning_session(mem)
    # A Pydantic AI thinking part of an Anthropic model: its signature verifies at Anthropic.
    signed = {**PYDANTIC_THINKING, "provider_name": "anthropic", "signature": SIGNATURE}
    mem.add(Msg.user("One more"))
    mem.add(Msg("assistant", (OpaqueBlock(signed), TextBlock("done"))))
    system, turns = mem.to_anthropic()
    assert shape_errors({"model": "m", "max_tokens": 1, "system": system, "messages": turns}) == []
    assert turns[: len(CONVERSATION)] == CONVERSATION  # Anthropic's own, byte for byte
    rounds = turns[len(CONVERSATION) :]
    for n in range(3):
        assert [b["type"] for b in rounds[4 * n + 1]["content"]] == ["text", "tool_use"]
    assert rounds[-1]["content"] == [
        {"type": "thinking", "thinking": PYDANTIC_THINKING["thinking"], "signature": SIGNATURE},
        {"type": "text", "text": "done"},
    ]
