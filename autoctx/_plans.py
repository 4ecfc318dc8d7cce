"""What planning reads (a snapshot) and what it writes (a plan).

Strategies are pure functions from a `Snapshot` and the config to a list of `Edit`s: no
database, no network, no clock, no uuid inside them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, TypeVar

from ._messages import Kind
from ._structure import MsgMeta
from ._tags import TAG_TOKENS

if TYPE_CHECKING:
    from ._config import AutoContextConfig

Reason: TypeAlias = Literal["count", "tokens"]
_T = TypeVar("_T")
_L_co = TypeVar("_L_co", covariant=True)


class LayoutCache(Protocol[_L_co]):
    """What a caller keeps of a session's layouts between passes (`strategies._common.Layouts`
    is the one kind): named here by what it does, so that this module, which the planners
    import, imports no planner."""

    def of(self, snapshot: Snapshot, config: AutoContextConfig) -> _L_co: ...


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The working context of a session at one version, metadata only."""

    session_id: str
    version: int
    messages: tuple[MsgMeta, ...]
    token_count: int
    message_count: int
    #: The handle the session's next offload takes (docs/design.md §4): a compression planned
    #: on this snapshot numbers its offloads from it, and applies only while it still holds.
    next_handle: int = 1

    def ids(self, start: int, end: int) -> tuple[int, ...]:
        return tuple(m.id for m in self.messages[start:end])

    def apply(
        self, changes: Sequence[tuple[Edit, MsgMeta]], next_handle: int | None = None
    ) -> Snapshot:
        """The snapshot once `changes` committed, as one apply (one transaction, one version
        later): edits planned on this snapshot, each with the metadata of the message that
        replaces its range (docs/design.md §2, "one transaction").

        What an edit means, written once: the SQL store brings its cached snapshot up to date
        with it after its own apply, and the in-memory store of the tests applies with it.
        Raises `ValueError` for an edit that does not replace the messages of this snapshot
        it names (a plan of another snapshot): a store checks that before it writes anything.
        `next_handle` is the session's handle counter after the apply (unchanged when None).
        """
        for edit, _ in changes:
            found = tuple(self.messages[i].id for i in edit.member_indices)
            if found != edit.replaced_ids:
                raise ValueError(
                    f"strategy {edit.strategy}'s edit replaces messages {edit.replaced_ids}, but "
                    f"session {self.session_id!r} at version {self.version} holds {found} at its "
                    "indices: plan again from the current snapshot"
                )
        return Snapshot(
            self.session_id,
            self.version + 1,
            tuple(splice(self.messages, changes)),
            self.token_count + sum(new.tokens - edit.replaced_tokens for edit, new in changes),
            self.message_count + sum(1 - len(edit.replaced_ids) for edit, _ in changes),
            self.next_handle if next_handle is None else next_handle,
        )


@dataclass(frozen=True, slots=True)
class Edit:
    """Replace working messages of ``snapshot.messages[start:end]`` by one new message.

    Usually the edit replaces the whole span. The fold replaces only its `members` (the span
    minus the system and pinned messages among them, which keep their places); the new message
    then takes the place of the last member.
    """

    strategy: int
    start: int
    end: int
    #: The ids of the replaced messages, in working order (checked again at apply time).
    replaced_ids: tuple[int, ...]
    #: The kind of the message that replaces them.
    new_kind: Kind
    #: Whether an LLM (summarizer) writes the replacement.
    llm: bool
    #: The tokens of the replaced messages (stored with them; messages never change, and apply
    #: checks the ids are still there).
    replaced_tokens: int
    #: S6 only: an earlier current-round summary at ``start`` whose text is kept verbatim as a
    #: prefix; only ``start + 1 .. end`` is summarized.
    verbatim_prefix_id: int | None = None
    #: S6 only: the summary's character budget.
    char_budget: int | None = None
    #: The fold only: the summary's token budget, stated in the request and enforced.
    token_budget: int | None = None
    #: The snapshot indices of the replaced messages when they are not the whole span (the
    #: fold); None means every index of [start, end).
    members: tuple[int, ...] | None = None
    #: The ids of the whole span [start, end) when it holds more than the replaced messages:
    #: what apply checks is still in the working set, in order, between the first and the last.
    span_ids: tuple[int, ...] | None = None
    #: Previews only: the characters the preview keeps when not `preview_chars` (masking's
    #: `mask_preview_chars`, docs/design.md §3).
    preview_chars: int | None = None
    #: Masking only: the characters of the preview's facts line (`mask_fact_chars`).
    fact_chars: int = 0

    @property
    def estimated_gain(self) -> int:
        """The tokens the edit is expected to save before it is made: a summary is estimated
        at a quarter of what it replaces, plus its offload tag (what the give-way rules and
        S5's choice plan with, docs/design.md §3)."""
        return self.replaced_tokens - (self.replaced_tokens // 4 + TAG_TOKENS)

    @property
    def member_indices(self) -> tuple[int, ...]:
        """The snapshot indices of the replaced messages, in order."""
        return self.members if self.members is not None else tuple(range(self.start, self.end))

    @property
    def expected_span(self) -> tuple[int, ...]:
        """The working ids apply expects between the first and the last replaced message."""
        return self.span_ids if self.span_ids is not None else self.replaced_ids


def splice(items: Sequence[_T], changes: Iterable[tuple[Edit, _T]]) -> list[_T]:
    """`items`, one per message of the snapshot the edits were planned on (its metadata, or
    the store's positions of its messages), after `changes`: each edit paired with the item of
    the message that replaces its range.

    An edit's replaced messages leave and the new one takes the place of the last of them; a
    fold's kept messages (the system and pinned ones between its members) stay where they
    were, in order, before it. The edits of one apply never overlap: they are spliced from the
    last to the first, so that the indices of the earlier ones stay valid.
    """
    out = list(items)
    for edit, new in sorted(changes, key=lambda change: change[0].start, reverse=True):
        start, end = edit.start, edit.end
        if edit.members is None:
            out[start:end] = [new]
            continue
        members = set(edit.members)
        kept = [out[k] for k in range(start, end - 1) if k not in members]
        out[start:end] = [*kept, new]
    return out


@dataclass(frozen=True, slots=True)
class PlanContext:
    """What the compressor tells the planners beyond the snapshot and the config."""

    #: The token trigger holds (S5 and S6 act only then; S1/S4 keep their token floor then).
    token_pressure: bool
    #: Ranges (by replaced ids) that failed earlier in this call: not planned again.
    failed: frozenset[tuple[int, ...]] = field(default_factory=frozenset)
    #: The working message count is at or over its target (`msg_target`): without the token
    #: trigger, S1/S4 then act without their token floor. Without either, the call goes on
    #: only for tokens (over the token target, under the trigger), and the floor stays.
    count_pressure: bool = True
    #: The call ends over the window and the offline summarizer stands in (docs/design.md §2):
    #: the fold keeps no recent rounds and no floor applies, so that the bound holds.
    fallback: bool = False
    #: The session's latest layout, the base of this snapshot's (see `strategies._common`):
    #: the caller's own, so the planners keep no state of their own.
    layouts: LayoutCache[Any] | None = field(default=None, compare=False, repr=False)
    #: Tokens expected to come in before the plan commits (a compression that runs beside the
    #: caller's appends): a plan sized to land under the target lands under it with them.
    arriving: int = 0

    @property
    def floor_waived(self) -> bool:
        """S1/S4 act without `min_compress_tokens`: the message count is the pressure."""
        return self.fallback or (self.count_pressure and not self.token_pressure)
