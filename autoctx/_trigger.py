"""When a compression is due: the trigger of a session's totals, and its target.

Pure: the memory asks before it claims the session (`is_due`, `wanted`), the loop asks at each
step (`trigger_of`, `under_target`); both read the thresholds of the config (docs/design.md §2),
and masking alone asks `masking_due` (§3, "early masking").
"""

from __future__ import annotations

from dataclasses import dataclass

from ._config import AutoContextConfig
from ._effects import SessionTotals


@dataclass(frozen=True, slots=True)
class Trigger:
    by_count: bool
    by_tokens: bool

    @property
    def fired(self) -> bool:
        return self.by_count or self.by_tokens

    @property
    def reason(self) -> str:
        return "tokens" if self.by_tokens else "count"


def trigger_of(message_count: int, token_count: int, config: AutoContextConfig) -> Trigger:
    return Trigger(
        by_count=config.msg_threshold is not None and message_count >= config.msg_threshold,
        by_tokens=token_count >= config.token_trigger,
    )


def under_target(
    message_count: int, token_count: int, config: AutoContextConfig, arriving: int = 0
) -> bool:
    """Whether the context is under the target; with `arriving`, whether it still is once that
    many more tokens have come in (see `SessionState.arriving`)."""
    target = config.msg_target
    return token_count + arriving < config.token_target and (
        target is None or message_count < target
    )


def is_due(info: SessionTotals, config: AutoContextConfig) -> bool:
    """Whether a `compress_if_needed()` call from these totals has anything to try: the trigger
    holds, and no earlier call settled at this very version (docs/design.md §2)."""
    fired = trigger_of(info.message_count, info.token_count, config).fired
    return fired and info.settled_version != info.version


@dataclass(frozen=True, slots=True)
class MaskFloor:
    """Where the latest call of this process left the working context (its tokens and
    messages): masking alone looks again only once the context has moved on from it
    (`masking_due`)."""

    tokens: int
    messages: int


def turnover_messages(config: AutoContextConfig) -> int:
    """The messages after which the tool results that masking keeps have all been replaced by
    newer ones: `mask_keep` steps of a call and its result (one step when it keeps none, the
    latest step then being what holds an output back)."""
    return 2 * max(1, config.mask_keep)


def masking_due(info: SessionTotals, config: AutoContextConfig, floor: MaskFloor | None) -> bool:
    """Whether masking may run alone, under the trigger (docs/design.md §3, "early masking"):
    the working context is at the mask trigger and, when an earlier call of this process left
    it at `floor`, has grown by `min_compress_tokens` since, or by enough messages that the
    tool results masking kept then have left the kept ones (`turnover_messages`). So a context
    whose outputs are all masked already is not planned again at every append, and an output
    that the kept results held back (a large file read by the latest steps) is masked once they
    have moved on, however few tokens the steps after it added."""
    trigger = config.mask_trigger
    if trigger is None or info.token_count < trigger or info.settled_version == info.version:
        return False  # a call settled at this version has masked what it could
    return (
        floor is None
        or info.token_count >= floor.tokens + max(1, config.min_compress_tokens)
        or info.message_count >= floor.messages + turnover_messages(config)
    )


def wanted(info: SessionTotals, config: AutoContextConfig, floor: MaskFloor | None) -> bool:
    """Whether a `compress_if_needed()` call from these totals has anything to do: the
    ladder (`is_due`) or masking alone (`masking_due`)."""
    return is_due(info, config) or masking_due(info, config, floor)
