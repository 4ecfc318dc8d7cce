"""The thresholds of SPEC.md, validated when the config is built."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

#: Strategies whose replacement text an LLM writes; their prompts are replaceable.
LLM_STRATEGIES = (1, 4, 5, 6)


@dataclass(frozen=True, slots=True)
class AutoContextConfig:
    """Every threshold of SPEC.md under SPEC.md's names, with SPEC.md's defaults.

    Invalid values and combinations raise `ConfigError` naming the field, when the config is
    built, so that a bad config never reaches a session.
    """

    #: Compress when the working context holds at least this many messages.
    msg_threshold: int = 100
    #: The model's context window, in tokens.
    max_tokens: int = 131072
    #: Compress when working tokens reach ``max_tokens * token_ratio``.
    token_ratio: float = 0.75
    #: Compression goes on until tokens and messages are under this share of their triggers' bases.
    target_ratio: float = 0.6
    large_payload_chars: int = 5120
    preview_chars: int = 200
    last_keep: int = 50
    min_tool_run: int = 6
    min_compress_tokens: int = 5000
    current_round_ratio: float = 0.3
    #: Picks the token encoding; fixed when a session is created.
    model: str = "gpt-4o"
    max_passes: int = 3
    max_llm_calls: int = 8
    #: Largest payload (characters of text, tool input and output) one message may carry.
    max_message_chars: int = 2_000_000
    #: Page size, in characters, of a `context_reload` answer (below `large_payload_chars`).
    reload_page_chars: int = 4000
    #: Raise summariser failures instead of recording them as `failed` events.
    strict: bool = False
    #: Run the Alembic migrations when a memory opens a database whose schema is behind.
    auto_upgrade: bool = True
    #: Replacement prompts, by strategy number (1, 4, 5, 6).
    prompts: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        positive_ints = (
            "msg_threshold",
            "max_tokens",
            "large_payload_chars",
            "preview_chars",
            "max_passes",
            "max_message_chars",
            "reload_page_chars",
        )
        for name in positive_ints:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(
                    f"AutoContextConfig.{name} must be a positive integer, got {value!r}"
                )
        non_negative = ("last_keep", "min_tool_run", "min_compress_tokens", "max_llm_calls")
        for name in non_negative:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(
                    f"AutoContextConfig.{name} must be an integer >= 0, got {value!r}"
                )
        for name in ("token_ratio", "target_ratio", "current_round_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
                raise ConfigError(
                    f"AutoContextConfig.{name} must be a number strictly between 0 and 1, "
                    f"got {value!r}"
                )
        if self.target_ratio >= self.token_ratio:
            raise ConfigError(
                f"AutoContextConfig.target_ratio ({self.target_ratio}) must be below token_ratio "
                f"({self.token_ratio}): the target has to sit under the trigger"
            )
        if self.preview_chars >= self.large_payload_chars:
            raise ConfigError(
                f"AutoContextConfig.preview_chars ({self.preview_chars}) must be smaller than "
                f"large_payload_chars ({self.large_payload_chars}): a preview longer than the "
                "large threshold would itself count as large"
            )
        if self.reload_page_chars > self.large_payload_chars:
            raise ConfigError(
                f"AutoContextConfig.reload_page_chars ({self.reload_page_chars}) must not exceed "
                f"large_payload_chars ({self.large_payload_chars}), or a reloaded page would be "
                "offloaded again"
            )
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError("AutoContextConfig.model must be a non-empty model name")
        if not isinstance(self.prompts, Mapping):
            raise ConfigError("AutoContextConfig.prompts must be a mapping of strategy -> prompt")
        for key, prompt in self.prompts.items():
            if key not in LLM_STRATEGIES:
                raise ConfigError(
                    f"AutoContextConfig.prompts has key {key!r}; only the LLM strategies "
                    f"{LLM_STRATEGIES} take prompts"
                )
            if not isinstance(prompt, str) or not prompt.strip():
                raise ConfigError(f"AutoContextConfig.prompts[{key}] must be a non-empty string")

    @property
    def token_trigger(self) -> int:
        """Working tokens at which compression starts."""
        return int(self.max_tokens * self.token_ratio)

    @property
    def token_target(self) -> int:
        """Working tokens under which compression stops."""
        return int(self.max_tokens * self.target_ratio)

    @property
    def msg_target(self) -> int:
        """Working messages under which compression stops."""
        return int(self.msg_threshold * self.target_ratio)

    def to_json(self) -> dict[str, Any]:
        """The thresholds as recorded on the session row and on each event."""
        data = dataclasses.asdict(self)
        data["prompts"] = {str(k): v for k, v in self.prompts.items()}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AutoContextConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        if "prompts" in kwargs:
            kwargs["prompts"] = {int(k): v for k, v in kwargs["prompts"].items()}
        return cls(**kwargs)
