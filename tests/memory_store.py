"""An in-memory store for the compressor's property tests, and the two sessions they run on.

`MemoryStore` implements the compression store contract (`autoctx._effects.CompressionStore`)
with dicts and lists, keeping the semantics the SQL store keeps (docs/design.md §2, §4):

- every committed change bumps the version: an append, and an apply (one for all of its
  replacements); events number every attempt, in commit order;
- an apply checks that each replaced range is still in the working set as the plan saw it
  (its ids adjacent and in order, a fold's kept messages between them); if any is not,
  nothing is written and each changed range gets a `conflict` event;
- an applied replacement writes its message, its offload (the replaced ids, in order), its
  lineage and an `applied` event with the totals before and after it; the new message takes
  the place of the last replaced one (`Snapshot.apply`, what an edit means, written once);
- `settle` records the version only if the session is still at it.

No erasure exists here, so `seen_version` never finds one. `MemorySession` drives the real
`Compressor` over it, as `AutoContextMemory.compress_if_needed()` does over the SQL store;
`PostgresSession` is the memory itself. The property tests run the same checks on both: many
examples in memory, in milliseconds each, and a few on PostgreSQL, so that the SQL store is
held to the same contract.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from autoctx import AutoContextConfig, AutoContextMemory, Event, Msg, OfflineSummarizer, Summarizer
from autoctx._coerce import coerce_messages
from autoctx._compression_state import SessionState
from autoctx._compressor import Compressor
from autoctx._intake import OpenCalls, Prepared, bind, count_tokens, prepare
from autoctx._messages import to_openai_messages
from autoctx._plans import Snapshot
from autoctx._replacements import ApplyOutcome, Replacement, event_groups, next_handle_after
from autoctx._structure import MsgMeta, meta_of
from autoctx._tokens import TokenCounter
from tests.invariants import (
    assert_every_handle_reloads,
    assert_every_original_reachable,
    assert_every_tag_reloads,
    assert_totals_match,
    assert_valid_openai_chat,
    originals,
)


@dataclass(frozen=True)
class Totals:
    """The session row, as `CompressionStore.totals` returns it."""

    version: int
    message_count: int
    token_count: int
    settled_version: int | None
    plan: Mapping[str, Any] | None = None


class MemoryStore:
    """One session's messages, working set, offloads, lineage and events, in memory."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.version = 0
        self.settled_version: int | None = None
        self.message_count = 0
        self.token_count = 0
        #: Every message ever stored (originals and what compressions made), by id.
        self.messages: dict[int, Msg] = {}
        #: The working context, in order.
        self.working: list[MsgMeta] = []
        self.events: list[Event] = []
        #: offload uuid -> the ids it removed, in order.
        self.offloads: dict[uuid.UUID, tuple[int, ...]] = {}
        #: offload handle -> its uuid.
        self.handles: dict[int, uuid.UUID] = {}
        self.next_handle = 1
        #: summary id -> the ids it replaced, in order (one level deep).
        self.lineage: dict[int, tuple[int, ...]] = {}
        #: The offload of what each made message replaced.
        self.offload_of: dict[int, uuid.UUID] = {}
        self.open_calls = OpenCalls()
        self._next_id = 1

    # -- what the memory does --------------------------------------------------------------

    def append(self, prepared: Sequence[Prepared]) -> list[Msg]:
        """Append atomically (validated against the open calls), one version later."""
        if not prepared:
            return []
        calls = OpenCalls(self.open_calls.to_json())
        bound = bind(prepared, calls, session_id=self.session_id)  # raises: nothing appended
        self.open_calls = calls
        out: list[Msg] = []
        for p in bound:
            msg = dataclasses.replace(p.msg, id=self._next_id, tokens=p.tokens)
            self._next_id += 1
            self.messages[msg.id or 0] = msg
            self.working.append(meta_of(msg, id=msg.id or 0, final=p.final, tokens=p.tokens))
            out.append(msg)
        self.message_count += len(bound)
        self.token_count += sum(p.tokens for p in bound)
        self.version += 1
        return out

    def working_messages(self) -> list[Msg]:
        return [self.messages[m.id] for m in self.working]

    def reload(self, offload: uuid.UUID | int) -> list[Msg]:
        key = self.handles[offload] if isinstance(offload, int) else offload
        return [self.messages[i] for i in self.offloads[key]]

    # -- the contract ------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        return Snapshot(
            self.session_id,
            self.version,
            tuple(self.working),
            self.token_count,
            self.message_count,
            self.next_handle,
        )

    def totals(self) -> Totals:
        return Totals(self.version, self.message_count, self.token_count, self.settled_version)

    def load_messages(self, ids: Iterable[int]) -> dict[int, Msg]:
        return {i: self.messages[i] for i in ids if i in self.messages}

    def apply(
        self,
        replacements: Sequence[Replacement],
        *,
        reason: str,
        config: Mapping[str, Any],
        seen_version: int | None = None,
    ) -> ApplyOutcome:
        if not replacements:
            return ApplyOutcome([], False)
        snap = self.snapshot()
        where = {m.id: k for k, m in enumerate(snap.messages)}
        # Each edit as it stands in the current snapshot (appends may have come since the
        # plan's), or None when its span is no longer there, adjacent and in order.
        edits = []
        for r in replacements:
            span = r.edit.expected_span
            first = where.get(span[0])
            found = None if first is None else snap.ids(first, first + len(span))
            if found != span:
                edits.append(None)
                continue
            assert first is not None  # found the span
            shift = first - r.edit.start
            members = r.edit.members
            edits.append(
                dataclasses.replace(
                    r.edit,
                    start=r.edit.start + shift,
                    end=r.edit.end + shift,
                    members=None if members is None else tuple(k + shift for k in members),
                )
            )
        # Handles numbered from an older counter: another offload took them (the SQL store
        # refuses the same way).
        taken = min(r.handle for r in replacements) < self.next_handle
        if taken or any(e is None for e in edits):
            changed = [r for r, e in zip(replacements, edits, strict=True) if e is None or taken]
            return ApplyOutcome(
                [
                    self.record_event(
                        strategy=changed[group[0]].edit.strategy,
                        status="conflict",
                        reason=reason,
                        replaced_ids=[i for k in group for i in changed[k].edit.replaced_ids],
                        error="the working set changed since the snapshot",
                        config=config,
                    )
                    for group in event_groups(changed)
                ],
                True,
            )
        version = self.version + 1
        count, tokens = self.message_count, self.token_count
        changes = []
        applied: list[Event] = []
        for group in event_groups(replacements):
            before = (count, tokens)
            replaced: list[int] = []
            made: list[int] = []
            event_id = len(self.events) + 1
            for k in group:
                r, edit = replacements[k], edits[k]
                assert edit is not None
                msg_id = self._next_id
                self._next_id += 1
                made.append(msg_id)
                msg = dataclasses.replace(r.new.msg, id=msg_id, tokens=r.new.tokens)
                self.messages[msg_id] = msg
                self.offloads[r.offload_uuid] = edit.replaced_ids
                assert r.handle not in self.handles, "a handle is unique within the session"
                self.handles[r.handle] = r.offload_uuid
                self.lineage[msg_id] = edit.replaced_ids
                self.offload_of[msg_id] = r.offload_uuid
                count += 1 - len(edit.replaced_ids)
                tokens += r.new.tokens - edit.replaced_tokens
                replaced.extend(edit.replaced_ids)
                changes.append(
                    (edit, meta_of(msg, id=msg_id, final=r.new.final, tokens=r.new.tokens))
                )
            single = replacements[group[0]] if len(group) == 1 else None
            applied.append(
                self._event(
                    strategy=replacements[group[0]].edit.strategy,
                    status="applied",
                    reason=reason,
                    replaced_ids=tuple(replaced),
                    before=before,
                    after=(count, tokens),
                    summary_message_id=made[0] if single else None,
                    offload_uuid=single.offload_uuid if single else None,
                    model=single.model if single else None,
                    prompt_tokens=single.prompt_tokens if single else None,
                    completion_tokens=single.completion_tokens if single else None,
                    latency_ms=single.latency_ms if single else None,
                    session_version=version,
                    facts=single.facts if single else None,
                )
            )
            assert applied[-1].id == event_id
        self.next_handle = next_handle_after(self.next_handle, replacements)
        after = snap.apply(changes, self.next_handle)
        # The totals the events counted are the totals of the spliced working set.
        assert (after.message_count, after.token_count) == (count, tokens)
        self.working = list(after.messages)
        self.message_count, self.token_count, self.version = count, tokens, version
        return ApplyOutcome(applied, False)

    def record_event(
        self,
        *,
        strategy: int,
        status: str,
        reason: str,
        replaced_ids: Sequence[int] = (),
        error: str | None = None,
        config: Mapping[str, Any],
        model: str | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        latency_ms: float | None = None,
    ) -> Event:
        totals = (self.message_count, self.token_count)
        return self._event(
            strategy=strategy,
            status=status,
            reason=reason,
            replaced_ids=tuple(replaced_ids),
            before=totals,
            after=totals,
            error=error,
            model=model,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_ms=latency_ms,
            session_version=self.version,
        )

    def settle(self, version: int) -> None:
        if self.version == version:
            self.settled_version = version

    def undone_ranges(self) -> frozenset[tuple[int, ...]]:
        """This store has no undo (the SQL store's is tested on PostgreSQL): its events
        never take a compression back, and the contract still holds."""
        by_id = {e.id: e for e in self.events}
        return frozenset(
            by_id[e.undoes].replaced_ids
            for e in self.events
            if e.reason == "undo" and e.undoes is not None
        )

    def _event(
        self,
        *,
        before: tuple[int, int],
        after: tuple[int, int],
        replaced_ids: tuple[int, ...],
        summary_message_id: int | None = None,
        offload_uuid: uuid.UUID | None = None,
        error: str | None = None,
        **fields: Any,
    ) -> Event:
        event = Event(
            session_id=self.session_id,
            id=len(self.events) + 1,
            messages_before=before[0],
            messages_after=after[0],
            tokens_before=before[1],
            tokens_after=after[1],
            replaced_ids=replaced_ids,
            summary_message_id=summary_message_id,
            offload_uuid=offload_uuid,
            error=error,
            **fields,
        )
        self.events.append(event)
        return event


class PropertySession(Protocol):
    """What a property test does with a session, on either store."""

    config: AutoContextConfig

    def add(self, batch: Sequence[Msg]) -> list[Msg]: ...

    def compress(self) -> list[Event]: ...

    def token_count(self) -> int: ...

    def version(self) -> int: ...

    def events(self) -> list[Event]: ...

    def originals(self) -> list[Msg]: ...

    def check(self) -> None:
        """The working context is valid OpenAI chat, its totals equal the stored tokens and a
        fresh count, and every original is reachable through reload."""
        ...

    def close(self) -> None: ...


class MemorySession:
    """The compressor over a `MemoryStore`, as `AutoContextMemory` drives it (no background)."""

    def __init__(self, config: AutoContextConfig, summarizer: Summarizer) -> None:
        self.config = config
        self.summarizer = summarizer
        self.store = MemoryStore(f"memory-{uuid.uuid4().hex}")
        self.counter = TokenCounter(config.model)
        self.state = SessionState()
        self._counted: dict[int, int] = {}

    def add(self, batch: Sequence[Msg]) -> list[Msg]:
        prepared = prepare(
            coerce_messages(list(batch)),
            self.counter,
            max_chars=self.config.max_message_chars,
            session_id=self.store.session_id,
        )
        return self.store.append(prepared)

    def compress(self) -> list[Event]:
        compressor = Compressor(
            self.store,
            self.store.session_id,
            self.config,
            self.counter,
            self.summarizer,
            self.state,
            fallback=OfflineSummarizer(),
        )
        return compressor.run(self.store.totals())

    def token_count(self) -> int:
        return self.store.token_count

    def version(self) -> int:
        return self.store.version

    def events(self) -> list[Event]:
        return list(self.store.events)

    def originals(self) -> list[Msg]:
        return [m for _, m in sorted(self.store.messages.items()) if m.kind == "original"]

    def check(self) -> None:
        store = self.store
        working = store.working_messages()
        assert_valid_openai_chat(to_openai_messages(working))
        assert (store.message_count, store.token_count) == (
            len(store.working),
            sum(m.tokens for m in store.working),
        )
        assert store.token_count == sum(self._fresh_count(m) for m in working)
        # Every original reachable by reload from a working message, one level at a time.
        offload_of = store.offload_of
        reachable = {m.id for m in store.working}
        frontier = [i for i in reachable if i in offload_of]
        while frontier:
            offload = offload_of[frontier.pop()]
            assert offload is not None
            for m in store.reload(offload):
                reachable.add(m.id or 0)
                if m.id in offload_of:
                    frontier.append(m.id)
        missing = [m.id for m in self.originals() if m.id not in reachable]
        assert not missing, f"originals not reachable by reload: {missing}"
        # The model's way down: the handles in the tags it reads.
        assert_every_tag_reloads(
            working, store.reload, store.lineage, [m.id or 0 for m in self.originals()]
        )
        # And the working set stands for every original exactly once through lineage (in id
        # order but for the system and pinned messages a fold keeps in place, before it); no
        # message was replaced twice.
        assert not [i for i, n in Counter(_replaced(store)).items() if n > 1]
        flat = [o for m in store.working for o in _expand(store, m.id)]
        assert sorted(flat) == [m.id for m in self.originals()]

    def _fresh_count(self, msg: Msg) -> int:
        """The message's tokens counted again (once per message: stored messages never
        change)."""
        assert msg.id is not None
        if msg.id not in self._counted:
            self._counted[msg.id] = count_tokens(msg, self.counter)
        return self._counted[msg.id]

    def close(self) -> None:
        pass


def _replaced(store: MemoryStore) -> Iterator[int]:
    for e in store.events:
        if e.status == "applied":
            yield from e.replaced_ids


def _expand(store: MemoryStore, i: int) -> Iterator[int]:
    if i in store.lineage:
        for child in store.lineage[i]:
            yield from _expand(store, child)
    else:
        yield i


class PostgresSession:
    """`AutoContextMemory` on PostgreSQL, checked with plain SQL (tests/invariants.py)."""

    def __init__(self, db_url: str, config: AutoContextConfig, summarizer: Summarizer) -> None:
        self.config = config
        self.mem = AutoContextMemory.open(
            f"prop-{uuid.uuid4().hex}", db_url, config, summarizer=summarizer
        )

    def add(self, batch: Sequence[Msg]) -> list[Msg]:
        return self.mem.add(list(batch))

    def compress(self) -> list[Event]:
        return self.mem.compress_if_needed()

    def token_count(self) -> int:
        return self.mem.refresh().token_count

    def version(self) -> int:
        return self.mem.version()

    def events(self) -> list[Event]:
        return self.mem.events()

    def originals(self) -> list[Msg]:
        return originals(self.mem)

    def check(self) -> None:
        assert_valid_openai_chat(self.mem.to_openai())
        assert_totals_match(self.mem)
        assert_every_original_reachable(self.mem)
        assert_every_handle_reloads(self.mem)

    def close(self) -> None:
        self.mem.delete()
