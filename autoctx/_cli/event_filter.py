"""`autoctx history`'s filters: which events to show, by kind, status and time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import get_args

from .. import _arguments
from .._events import MANUAL as MANUAL_STRATEGY
from .._events import Event, Status
from .._strategies import registry
from .root import CliError

STATUSES: tuple[str, ...] = get_args(Status)


def _kinds() -> dict[str, tuple[int, str | None]]:
    """Every name `--strategy` takes: a rung's number or name (`7`, `S7`, `fold`), or the
    kind of an event that compresses nothing (`pop`, `clear`, `fork`, `erase`), each to its
    (strategy, reason) pair (reason None: any)."""
    names: dict[str, tuple[int, str | None]] = {}
    for number, name in registry.STRATEGY_NAMES.items():
        if registry.is_compression(number):
            for key in (str(number), f"s{number}", name.lower().replace(" ", "-")):
                names[key] = (number, None)
    names["fold"] = names["history-fold"]  # what the docs call strategy 7
    for reason, kind in registry.MANUAL_KINDS.items():
        names[kind] = (MANUAL_STRATEGY, reason)
    return names


@dataclass(frozen=True, slots=True)
class EventFilter:
    kinds: tuple[tuple[int, str | None], ...] = ()
    statuses: tuple[str, ...] = ()
    since: datetime | None = None
    until: datetime | None = None

    @classmethod
    def parse(
        cls,
        strategies: Sequence[str],
        statuses: Sequence[str],
        since: str | None,
        until: str | None,
        now: datetime | None = None,
    ) -> EventFilter:
        """The filter the options name; `CliError` naming the option and what it takes."""
        known = _kinds()
        kinds = []
        for text in strategies:
            key = text.strip().lower()
            if key not in known:
                names = sorted(k for k in known if not k.removeprefix("s").isdigit())
                raise CliError(
                    f"--strategy {text!r} is not a kind of event; give a strategy's number (1 to "
                    f"{max(n for n, _ in known.values())}) or one of {', '.join(names)}"
                )
            kinds.append(known[key])
        for status in statuses:
            if status not in STATUSES:
                raise CliError(f"--status {status!r} is unknown; give one of {', '.join(STATUSES)}")
        at = now or datetime.now(UTC)

        def ago(option: str, text: str | None) -> datetime | None:
            if text is None:
                return None
            try:
                return at - _arguments.duration(text)
            except ValueError as exc:
                raise CliError(f"{option}: {exc}") from None

        return cls(tuple(kinds), tuple(statuses), ago("--since", since), ago("--until", until))

    def __bool__(self) -> bool:
        return bool(self.kinds or self.statuses or self.since or self.until)

    def keeps(self, event: Event) -> bool:
        if self.kinds and not any(
            event.strategy == number and (reason is None or event.reason == reason)
            for number, reason in self.kinds
        ):
            return False
        if self.statuses and event.status not in self.statuses:
            return False
        when = event.created_at
        if when is not None and self.since is not None and when < self.since:
            return False
        return not (when is not None and self.until is not None and when > self.until)

    def __call__(self, events: Sequence[Event]) -> list[Event]:
        return [e for e in events if self.keeps(e)]
