"""Reload to the originals (docs/design.md §4, issue 23 item 5): `mem.reload(uuid,
originals=True)` and `context_reload` with ``"originals": true`` answer the raw messages behind an
offload through every nested summary and preview, paged; the default stays one level deep.

On real PostgreSQL through the migrations, with sessions compressed by the ladder (the offline
summarizer) until summaries hold previews and earlier summaries.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from autoctx import (
    AsyncAutoContextMemory,
    AutoContextMemory,
    Event,
    InvalidMessageId,
    Msg,
    OfflineSummarizer,
)
from autoctx._transcript import render_transcript
from tests.histories import SMALL, long_task, multi_round

Open = Callable[..., AutoContextMemory]


def _nested(mem: AutoContextMemory) -> tuple[uuid.UUID, dict[int, uuid.UUID]]:
    """Compress `mem` step by step until an offload holds a summary or preview of its own;
    (that offload, the offload of every summary)."""
    history = multi_round(23, rounds=8, steps=8)
    for start in range(0, len(history), 12):
        mem.add(history[start : start + 12])
        mem.compress_if_needed()
    offload_of = _offloads(mem.events())
    for summary_id in sorted(offload_of, reverse=True):
        held = mem.reload(offload_of[summary_id])
        if any(m.kind != "original" for m in held):
            return offload_of[summary_id], offload_of
    raise AssertionError("no offload holds a nested summary")


def _offloads(events: list[Event]) -> dict[int, uuid.UUID]:
    return {
        e.summary_message_id: e.offload_uuid
        for e in events
        if e.status == "applied" and e.summary_message_id and e.offload_uuid
    }


def _by_hand(
    mem: AutoContextMemory, offload: uuid.UUID, offload_of: dict[int, uuid.UUID]
) -> list[Msg]:
    """The originals behind `offload`, found one level at a time through the default reload."""
    out: list[Msg] = []
    for m in mem.reload(offload):
        assert m.id is not None
        if m.kind == "original":
            out.append(m)
        else:
            out.extend(_by_hand(mem, offload_of[m.id], offload_of))
    return out


def _ask(mem: AutoContextMemory, **args: Any) -> str:
    call = {"function": {"name": "context_reload", "arguments": json.dumps(args)}}
    return mem.handle_tool_call(call)


def test_reload_reaches_the_originals_through_nested_summaries(open_memory: Open) -> None:
    mem = open_memory(config=SMALL)
    offload, offload_of = _nested(mem)
    one_level = mem.reload(offload)
    assert any(m.kind != "original" for m in one_level), "the default stays one level deep"
    originals = mem.reload(offload, originals=True)
    assert originals and all(m.kind == "original" for m in originals)
    expected = _by_hand(mem, offload, offload_of)
    assert [m.id for m in originals] == sorted(m.id for m in expected if m.id is not None)
    assert originals == sorted(expected, key=lambda m: m.id or 0)
    # More than one level: some of them sit behind a summary the offload holds.
    assert {m.id for m in originals} - {m.id for m in one_level}
    # Paged by message, as the default reload.
    assert mem.reload(str(offload), offset=2, limit=3, originals=True) == originals[2:5]
    version = mem.version()
    # The tool: the same originals, page after page, and its definition offers the choice.
    pages, offset = [], 0
    while True:
        answer = _ask(mem, uuid=str(offload), originals=True, offset=offset)
        if "\n[page: characters " not in answer:
            pages.append(answer)
            break
        page, footer = answer.rsplit("\n[page: characters ", 1)
        assert len(page) <= SMALL.reload_page_chars
        pages.append(page)
        offset = int(footer.rsplit("offset=", 1)[1].split(" ")[0])
    assert "".join(pages) == render_transcript(originals, keep_tags=True)
    assert "CONTEXT_OFFLOAD" not in "".join(pages), "no nested tag: everything is raw"
    assert _ask(mem, uuid=str(offload)).startswith(
        render_transcript(one_level, keep_tags=True)[: SMALL.reload_page_chars]
    )
    assert "Invalid originals" in _ask(mem, uuid=str(offload), originals="yes")
    assert "not to a message_id" in _ask(mem, message_id=1, originals=True)
    with pytest.raises(InvalidMessageId, match="offload id"):
        mem.reload(message_id=1, originals=True)
    with pytest.raises(ValueError, match="originals must be True or False"):
        mem.reload(offload, originals="yes")  # type: ignore[arg-type]
    properties = mem.tools()[0]["function"]["parameters"]["properties"]
    assert properties["originals"]["type"] == "boolean"
    assert mem.version() == version, "reloading never changes the working context"


def test_the_originals_of_a_current_round_summary_over_previews(open_memory: Open) -> None:
    """A long task (one round, no final answer) in a small window: large outputs become
    previews, and S6 then summarizes the round, previews and earlier summaries included."""
    config = dataclasses.replace(SMALL, max_tokens=6000, min_tool_run=10_000)
    mem = open_memory(config=config)
    history = long_task(5, steps=80, big_every=3)
    for start in range(0, len(history), 4):
        mem.add(history[start : start + 4])
        mem.compress_if_needed()
    offload_of = _offloads(mem.events())
    over_previews = [
        e.offload_uuid
        for e in mem.events()
        if e.status == "applied"
        and e.strategy == 6
        and e.offload_uuid is not None
        and "preview" in {m.kind for m in mem.reload(e.offload_uuid)}
    ]
    assert over_previews, "an S6 summary over previews"
    offload = over_previews[0]
    originals = mem.reload(offload, originals=True)
    assert all(m.kind == "original" for m in originals)
    expected = _by_hand(mem, offload, offload_of)
    assert [m.id for m in originals] == sorted(m.id for m in expected if m.id is not None)
    # A raw tool output behind a preview is on the first page of the tool's answer.
    raw = next(
        r.output_text
        for m in originals
        for r in m.tool_results
        if len(r.output_text) > config.preview_chars
    )
    assert raw[:1000] in _ask(mem, uuid=str(offload), originals=True)


def test_the_async_memory_reloads_the_originals(db_url: str, session_id: str) -> None:
    async def main() -> None:
        mem = await AsyncAutoContextMemory.open(
            session_id, db_url, SMALL, summarizer=OfflineSummarizer()
        )
        try:
            offload, _ = _nested(mem.sync)
            assert await mem.reload(offload, originals=True) == mem.sync.reload(
                offload, originals=True
            )
        finally:
            await mem.close()

    asyncio.run(main())
