"""What an erasure writes (docs/design.md §9): tombstones, and summaries rewritten without what
was erased. Pure: the store reads the rows, calls `rewrite_erased`, and writes what it returns
in the same transaction (`autoctx._store.erase.erase`).

- An erased original keeps its role, id, time, pinned flag and tool structure (every call id
  and tool name, every result's call id), so that the working context stays valid OpenAI chat;
  its text, tool arguments, tool outputs, opaque blocks, participant name and free metadata
  are gone.
- Every message derived from it by lineage, up to the working message that stands for it, is
  rewritten bottom-up (children before parents: a summary's id is always greater than the ids
  it replaced), from what it replaced as that now stands, the erased messages left out:
  a preview is made again from its (tombstoned) original, a large-message summary keeps its
  tool ids around a tombstone, and a text summary is written again by the offline summarizer
  over the messages it replaced (what its offload holds, one level deep, which is what the
  summarizer read when it was made), with as many characters as the text it replaces (so
  that it loses what was erased and keeps the rest, instead of shrinking to a fraction), or
  becomes a tombstone when nothing of them remains. Each
  keeps its offload tag, so reload works as before. A rewritten summary is never longer in
  tokens than the one it replaces, so an erasure never pushes a context over its window.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._arguments import OffloadRef, offload_id
from ._config import AutoContextConfig
from ._errors import InvalidOffloadId
from ._intake import Prepared, count_tokens
from ._messages import (
    OPENAI_META,
    Block,
    Msg,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    block_from_json,
    json_value,
)
from ._prompts import build_request
from ._replacements import preview, summarized_payload
from ._strategies.registry import FOLD, LADDER
from ._summarizers import OfflineSummarizer
from ._tags import offload_tag
from ._tokens import TokenCounter
from ._tools import SEARCH_TOOL_NAME, TOOL_NAME

#: What stands where erased content was.
TOMBSTONE = "[erased]"
#: The summaries the offline summarizer can write again as text: those of the rungs an LLM
#: writes for (they have a prompt), but a large message's, which is a payload (rewritten above).
_TEXT_SUMMARY_STRATEGIES = frozenset(
    r.number for r in LADDER if r.llm and r.writes != "large_summary"
)


@dataclass(frozen=True, slots=True)
class Derived:
    """A stored message made from others (a summary, a preview, or the remainder `pop_last`
    left), as an erasure finds it by lineage."""

    msg: Msg
    #: The strategy of the event that made it (0 for `pop_last`); None if unknown.
    strategy: int | None
    #: Its offload's handle, which its tag shows (None for a `pop_last` remainder, which has
    #: no offload). A message written before handles had a uuid tag; its rewrite shows the
    #: handle its offload was given since, which reloads the same messages.
    handle: int | None
    #: The ids it replaced, in lineage order.
    children: tuple[int, ...]


def tombstone(msg: Msg) -> Msg:
    """`msg` with its content erased and its structure kept (see the module docstring)."""
    blocks: list[Block] = []
    texts = False
    for b in msg.content:
        if isinstance(b, ToolUseBlock):
            blocks.append(ToolUseBlock(b.id, b.name, "{}"))
        elif isinstance(b, ToolResultBlock):
            blocks.append(ToolResultBlock(b.tool_use_id, TOMBSTONE, b.name))
        elif not texts:  # text and opaque blocks: one tombstone for all of them
            texts = True
            blocks.append(TextBlock(TOMBSTONE))
    if not blocks:
        blocks.append(TextBlock(TOMBSTONE))
    # Of the free metadata, only the role the OpenAI format was given in (developer) stays:
    # anything else may hold content.
    role = (msg.metadata.get(OPENAI_META) or {}).get("role")
    metadata = {OPENAI_META: {"role": role}} if role is not None else {}
    # The participant name goes too: it is free text the caller chose (a person's name, say).
    return Msg(
        msg.role,
        tuple(blocks),
        metadata=metadata,
        kind=msg.kind,
        pinned=msg.pinned,
        id=msg.id,
    )


def rewrite_erased(
    erased: Mapping[int, Msg],
    derived: Sequence[Derived],
    stored: Mapping[int, Msg],
    config: AutoContextConfig,
    counter: TokenCounter,
) -> dict[int, Prepared]:
    """The new version of every erased original and every message derived from them, by id.

    `stored` holds every message the rewrite reads (the children of each derived message).
    """
    new: dict[int, Msg] = {i: tombstone(m) for i, m in erased.items()}
    # Messages left with nothing but tombstones: a summary of them is a tombstone too.
    gone: set[int] = set(erased)
    for d in sorted(derived, key=lambda x: x.msg.id or 0):
        assert d.msg.id is not None
        kids = [new.get(c) or stored[c] for c in d.children]
        remaining = [k for k in kids if k.id not in gone]
        msg = _rewrite(d, kids, remaining, config, counter)
        new[d.msg.id] = msg
        if not remaining:
            gone.add(d.msg.id)
    return {
        i: Prepared(m, count_tokens(m, counter), m.payload_chars, False) for i, m in new.items()
    }


def _rewrite(
    d: Derived,
    kids: list[Msg],
    remaining: list[Msg],
    config: AutoContextConfig,
    counter: TokenCounter,
) -> Msg:
    old = d.msg
    if d.handle is None or old.kind == "original" or not kids:
        # A `pop_last` remainder holds part of the message it came from: nothing to redo.
        return tombstone(old)
    if old.kind == "preview":
        return _stored_as(old, preview(kids[0], config, d.handle))
    tag = offload_tag(d.handle)
    # The rewrite may be as long as the text it replaces (what is left of the originals is
    # usually far longer): the summary loses what was erased and keeps the rest, instead of
    # shrinking to the offline summarizer's default of a quarter of its input, capped.
    budget = max(1, _body_chars(old) - len(tag) - 1)
    if old.kind == "large_summary":
        body = TOMBSTONE if not remaining else _offline_text(5, remaining, config, budget)
        return _stored_as(old, summarized_payload(kids[0], body, d.handle))
    strategy = d.strategy if d.strategy in _TEXT_SUMMARY_STRATEGIES else None
    if strategy is None or not remaining:
        text = TOMBSTONE
    else:
        text = _offline_text(strategy, remaining, config, budget)
    msg = _stored_as(old, Msg.assistant(f"{text}\n{tag}", kind=old.kind))
    over = count_tokens(msg, counter) - (old.tokens or 0)
    if over > 0 and text != TOMBSTONE:
        # Never longer than what it rewrites: clip the extract (the tag stays whole).
        keep = max(1, counter.count(text) - over)
        clipped = counter.clip(text, keep).rstrip() or TOMBSTONE
        msg = _stored_as(old, Msg.assistant(f"{clipped}\n{tag}", kind=old.kind))
    return msg


def _offline_text(
    strategy: int, msgs: list[Msg], config: AutoContextConfig, char_budget: int
) -> str:
    request = build_request(
        strategy,
        msgs,
        prompts=config.prompts,
        char_budget=char_budget,
        token_budget=config.fold_budget_tokens if strategy == FOLD else None,
    )
    return OfflineSummarizer().summarize(request).text.strip() or TOMBSTONE


def _body_chars(msg: Msg) -> int:
    """The characters of a summary's text (or, in a tool message, of its longest output)."""
    return max(
        [len(msg.text)] + [len(b.output_text) for b in msg.tool_results],
    )


def _stored_as(old: Msg, new: Msg) -> Msg:
    """`new` in the place of `old`: its id, kind and pinned flag."""
    return Msg(new.role, new.content, name=new.name, kind=old.kind, pinned=old.pinned, id=old.id)


# ---------------------------------------------------------------------------------------------
# Copies autoctx made: the answers of its context tools
# ---------------------------------------------------------------------------------------------

#: The names of the tools whose answers quote stored messages.
CONTEXT_TOOLS = (SEARCH_TOOL_NAME, TOOL_NAME)
#: A hit of a `context_search` answer, as `autoctx._search.render_hit` writes its head.
_HIT = re.compile(r'^\d+\. \[(?:this session|session ("(?:[^"\\]|\\.)*")), message (\d+), ', re.M)


@dataclass(frozen=True, slots=True)
class Quote:
    """What one context-tool answer quoted: a message, or the messages of an offload."""

    session_id: str
    message_id: int | None = None
    #: The offload's uuid, or its handle (`context_reload`'s `offload` argument).
    offload: OffloadRef | None = None


def quotes(
    answer: Sequence[Mapping[str, Any]], call: Sequence[Mapping[str, Any]], own_session: str
) -> list[Quote]:
    """What a stored context-tool answer (a tool message's content JSON) quoted, read from the
    answer itself (a search answer names each hit's session and message) and from the call it
    answers (a reload names a message or an offload, and a session): autoctx wrote the answer,
    so its form is known. Anything that does not parse quotes nothing."""
    calls: dict[str, ToolUseBlock] = {}
    for data in call:
        block = _block(data)
        if isinstance(block, ToolUseBlock):
            calls[block.id] = block
    out: list[Quote] = []
    for data in answer:
        block = _block(data)
        if not isinstance(block, ToolResultBlock):
            continue
        made = calls.get(block.tool_use_id)
        name = made.name if made is not None else block.name
        if name == SEARCH_TOOL_NAME:
            for m in _HIT.finditer(block.output_text):
                session = own_session
                if m.group(1) is not None:
                    with contextlib.suppress(ValueError):
                        session = str(json.loads(m.group(1)))
                out.append(Quote(session, message_id=int(m.group(2))))
        elif name == TOOL_NAME and made is not None:
            quote = _reload_quote(made.arguments, own_session)
            if quote is not None:
                out.append(quote)
    return out


def _block(data: Mapping[str, Any]) -> Block | None:
    try:
        return block_from_json(data)
    except (KeyError, TypeError, ValueError):
        return None


def _reload_quote(arguments: str, own_session: str) -> Quote | None:
    try:
        args = json_value(arguments)
    except (ValueError, RecursionError):
        return None
    if not isinstance(args, dict):
        return None
    session = args.get("session_id")
    session = session if isinstance(session, str) and session else own_session
    message_id, raw = args.get("message_id"), args.get("offload", args.get("uuid"))
    if isinstance(message_id, int) and not isinstance(message_id, bool):
        return Quote(session, message_id=message_id)
    try:
        return Quote(session, offload=offload_id(raw))
    except InvalidOffloadId:
        return None


def quotes_any(
    found: Iterable[Quote],
    changed: Mapping[str, set[int]],
    offloads: Mapping[tuple[str, OffloadRef], Sequence[int]],
) -> bool:
    """Whether an answer that quoted `found` holds content of a message in `changed` (session
    -> ids an erasure rewrites), `offloads` giving the message ids each offload holds."""
    for q in found:
        ids = changed.get(q.session_id)
        if not ids:
            continue
        if q.message_id is not None and q.message_id in ids:
            return True
        if q.offload is not None and ids.intersection(offloads.get((q.session_id, q.offload), ())):
            return True
    return False
