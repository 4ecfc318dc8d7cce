"""The store seen by one session's compression: `autoctx._effects.CompressionStore` over the
SQL `Store`, with the session id bound (the contract has none: a store answers for one
session). Each method is the `Store` method of the same name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .._events import Event
from .._messages import Msg
from .._plans import Snapshot
from .._replacements import ApplyOutcome, Replacement
from .rows import SessionInfo
from .store import Store


class BoundStore:
    """`Store`'s compression operations for one session."""

    def __init__(self, store: Store, session_id: str) -> None:
        self.store = store
        self.session_id = session_id

    def snapshot(self) -> Snapshot:
        return self.store.snapshot(self.session_id)

    def totals(self) -> SessionInfo:
        return self.store.totals(self.session_id)

    def load_messages(self, ids: Iterable[int]) -> dict[int, Msg]:
        return self.store.load_messages(self.session_id, ids)

    def apply(
        self,
        replacements: Sequence[Replacement],
        *,
        reason: str,
        config: Mapping[str, Any],
        seen_version: int | None = None,
    ) -> ApplyOutcome:
        return self.store.apply(
            self.session_id, replacements, reason=reason, config=config, seen_version=seen_version
        )

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
        return self.store.record_event(
            self.session_id,
            strategy=strategy,
            status=status,
            reason=reason,
            replaced_ids=replaced_ids,
            error=error,
            config=config,
            model=model,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_ms=latency_ms,
        )

    def settle(self, version: int) -> None:
        self.store.settle(self.session_id, version)
