"""The thresholds of docs/design.md, validated when the config is built, and the options of
the process that runs compressions.

`AutoContextConfig` holds what is stored with a session (its thresholds, model, prompts and
search configuration: every process that compresses the session reads the same ones);
`RuntimeOptions` holds how one process runs a compression (passes, summarizer calls,
deadlines, concurrency, strictness), given to `open` and to the worker and never stored.
Whether to upgrade the schema is the client's (`auto_upgrade=` on `AutoContextClient` and
`open`).

Some defaults follow other fields (docs/design.md §2, "defaults follow the window"): the sizes
that are relative to the window (`min_compress_tokens`, `fold_keep_tokens`,
`fold_budget_tokens`) follow `max_tokens`, and the defaults that must stay consistent with a
field the caller set (`reload_page_chars` and `preview_chars` under `large_payload_chars`,
`mask_min_chars` over `mask_preview_chars`, the two ratios) adapt to it. Only values the
caller set can be refused.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from . import _arguments
from ._errors import ConfigError, InvalidStoredConfig
from ._llm_rungs import LLM_STRATEGIES
from ._search import DEFAULT_SEARCH_CONFIG, validate_search_config

#: The window the fixed defaults of docs/design.md §3 are stated for.
REFERENCE_WINDOW: Final = 131072
_MIN_COMPRESS_TOKENS_AT_REFERENCE: Final = 5000
#: The protected tail of docs/design.md §3 is 50 messages at the reference window (about
#: 17,000 tokens of typical agent steps, a fifth of the token target). It is a size relative
#: to the window (docs/design.md §2): 50 messages would fill a 32,000-token window's target
#: by themselves, leaving S1 to S3 nothing that reaches it, and sending every long task to S6,
#: which then summarizes the protected tail anyway. A tail keeps a few steps at any window.
_LAST_KEEP_AT_REFERENCE: Final = 50
_LAST_KEEP_MIN: Final = 8
_TOKEN_RATIO: Final = 0.75
_TARGET_RATIO: Final = 0.4
_PREVIEW_CHARS: Final = 200
#: Masking (docs/design.md §3): the most recent tool results it keeps, and the characters of
#: its previews; it masks outputs over twice the preview (a shorter one gains little).
_MASK_KEEP: Final = 3
_MASK_PREVIEW_CHARS: Final = 100
_MASK_MIN_PER_PREVIEW: Final = 2
_MASK_RATIO: Final = 0.15
_MASK_FACT_CHARS: Final = 48
_RELOAD_PAGE_CHARS: Final = 4000
#: The summarizer sees a tenth of the large threshold of each tool output (512 characters at
#: the default): its first lines and last lines, where a result says what it is and how it
#: ended (OpenHands' condenser sends 500 characters of each observation for the same reason).
_CLIP_PER_LARGE: Final = 10
#: The fold keeps recent rounds up to this share of the token target, and summarizes the rest
#: within this share of it.
_FOLD_KEEP_SHARE: Final = 0.25
_FOLD_BUDGET_SHARE: Final = 0.1
#: A real LLM writing the fold's budget (about 7,900 tokens at the reference window) takes
#: over a minute at common output speeds; two minutes leave room for that and for a retry
#: after a fast failure, and still bound what a stalled endpoint costs one call.
DEFAULT_SUMMARIZER_DEADLINE_S: Final = 120.0
#: Room for the fold's call and a few shorter S1/S4/S5/S6 calls around it. When it passes,
#: the ladder stops calling the summarizer and the offline fallback keeps the bound.
DEFAULT_COMPRESS_DEADLINE_S: Final = 300.0


class _Derived(int):
    """An int the config derived from other fields rather than one the caller set.

    It is what a derived field holds, so that ``dataclasses.replace(config, max_tokens=...)``
    (which passes every field back in) derives it again instead of freezing the old value,
    and so that a derived value never makes a `ConfigError` about a field the caller did not set.
    """

    __slots__ = ()


class _DerivedRatio(float):
    """The float counterpart of `_Derived` (for the two ratios)."""

    __slots__ = ()


#: The default of every derived field: "not set by the caller".
_UNSET: Final = _Derived(0)
_UNSET_RATIO: Final = _DerivedRatio(0.0)

#: The fields whose defaults are derived, in the order they are derived.
DERIVED_FIELDS: Final = (
    "reserve_tokens",
    "last_keep",
    "token_ratio",
    "target_ratio",
    "preview_chars",
    "reload_page_chars",
    "min_compress_tokens",
    "fold_keep_tokens",
    "fold_budget_tokens",
    "transcript_clip_chars",
    "mask_min_chars",
)


def _given(value: object) -> bool:
    """Whether the caller set this value (None and the derived markers mean they did not)."""
    return value is not None and not isinstance(value, _Derived | _DerivedRatio)


@dataclass(frozen=True, slots=True)
class AutoContextConfig:
    """Every threshold of docs/design.md under the design's names, with the design's defaults:
    what is recorded with a session, so that every process compressing it reads the same ones
    (how one process runs a compression is its `RuntimeOptions`, docs/design.md §8).

    Invalid values and combinations raise `ConfigError` naming the field, when the config is
    built, so that a bad config never reaches a session. ``AutoContextConfig(max_tokens=16_000)``
    alone is a sound config: the sizes relative to the window follow it.

    The latest open wins: opening a session with a config records it as the session's (every
    process that compresses the session, a worker included, reads it from then on), and when
    it differs from the recorded one a warning names each field it changes (``max_tokens
    16000 -> 64000``). Open without a config to use the recorded one. The model and the search
    configuration are the exceptions: they are fixed when the session is created.
    """

    #: Compress when the working context holds at least this many messages; None (the
    #: default) compresses on tokens only. Off by default, from measurement (docs/design.md §2):
    #: no peer has a count trigger, and on long tool tasks it fired summarizer calls while the
    #: tokens were far under their trigger. 100 is the design's value.
    msg_threshold: int | None = None
    #: The model's context window, in tokens.
    max_tokens: int = 131072
    #: Tokens of each model call that are not the working context: the tool definitions, the
    #: instructions and the room for the answer. They come off the window for every trigger,
    #: target and bound (`message_window`). When not set, it is what an integration measures
    #: of the tools and instructions it sends (`AutoContextMemory.reserve_for`), recorded with
    #: the session; 0 until something is measured. At most half of `max_tokens`.
    reserve_tokens: int = _UNSET
    #: Compress when working tokens reach ``max_tokens * token_ratio`` (default 0.75; above
    #: a `target_ratio` the caller set at 0.75 or more, halfway from it to 1).
    token_ratio: float = _UNSET_RATIO
    #: Compression goes on until tokens and messages are under this share of their triggers'
    #: bases (default 0.4; under a `token_ratio` the caller set at 0.4 or less, 0.8 of it).
    target_ratio: float = _UNSET_RATIO
    large_payload_chars: int = 5120
    #: Characters kept in a preview (default 200, at most half of `large_payload_chars`).
    preview_chars: int = _UNSET
    #: The protected tail, in messages (default 50 at a 131,072-token window, in proportion
    #: otherwise, at least 8): about a fifth of the token target of typical agent steps, so
    #: that at a small window the tail does not fill the target by itself.
    last_keep: int = _UNSET
    min_tool_run: int = 6
    #: The floor under which S1, S4 and the fold leave a range alone (default 5000 at a
    #: 131,072-token window, in proportion otherwise).
    min_compress_tokens: int = _UNSET
    current_round_ratio: float = 0.3
    #: The fold keeps the most recent whole rounds within this many tokens (default a quarter
    #: of the token target).
    fold_keep_tokens: int = _UNSET
    #: The fold's summary must fit in this many tokens (default a tenth of the token target).
    fold_budget_tokens: int = _UNSET
    #: A tool output (or tool-call arguments) longer than this goes to the summarizer as its
    #: head and tail, the cut marked in the request (default a tenth of
    #: `large_payload_chars`): the original stays whole in the summary's offload, reachable by
    #: its tag, so the summary needs only what it should say, not the bulk.
    transcript_clip_chars: int = _UNSET
    #: Masking keeps this many of the most recent tool results verbatim (default 3).
    mask_keep: int = _MASK_KEEP
    #: Characters a masked tool output keeps (default 100).
    mask_preview_chars: int = _MASK_PREVIEW_CHARS
    #: Masking leaves tool outputs of at most this many characters alone (default twice
    #: `mask_preview_chars`).
    mask_min_chars: int = _UNSET
    #: Masking runs alone (no LLM, before the token trigger) once the working context reaches
    #: this share of the window, when what it saves is worth the prompt cache it breaks
    #: (docs/design.md §3, "early masking"; default 0.15); None masks only in a compression
    #: the trigger fired.
    mask_ratio: float | None = _MASK_RATIO
    #: Characters of a masked preview's facts line: the output's best facts (labelled ids, ids,
    #: errors, paths) that its head does not show (docs/design.md §3; default 48, 0 for none).
    mask_fact_chars: int = _MASK_FACT_CHARS
    #: Picks the token encoding; fixed when a session is created.
    model: str = "gpt-4o"
    #: Largest payload (characters of text, tool input and output) one message may carry.
    max_message_chars: int = 2_000_000
    #: Page size, in characters, of a `context_reload` answer (default 4000, at most
    #: `large_payload_chars`).
    reload_page_chars: int = _UNSET
    #: Replacement prompts, by strategy number (1, 4, 5, 6 and 7, the fold).
    prompts: Mapping[int, str] = field(default_factory=dict)
    #: The PostgreSQL text search configuration the session's originals are indexed with for
    #: `search()`: "simple" (no stemming, no stop words: ids, paths and words match as
    #: written) or a language ("english", ...); None indexes nothing (appends skip the cost of
    #: the vector, and searches find nothing in the session). Fixed when the session is
    #: created, like `model`.
    search_config: str | None = DEFAULT_SEARCH_CONFIG
    #: The fact check (docs/design.md §6) lists the facts a summary left out on its index line;
    #: True also asks the summarizer once to repair a summary whose missing facts the line
    #: cannot hold (one more call; off by default, docs/design.md §6 says why).
    fact_repair: bool = False
    #: The index line of the facts a summary still lacks takes at most this share of the
    #: summary's budget, and the summary is asked for the rest (default 0.4, chosen by
    #: measurement, docs/design.md §6; 0 adds no line).
    fact_index_ratio: float = 0.4

    def __post_init__(self) -> None:
        if self.msg_threshold is not None:
            _check_int("msg_threshold", self.msg_threshold, minimum=1)
        positive_ints = (
            "max_tokens",
            "large_payload_chars",
            "max_message_chars",
        )
        for name in positive_ints:
            _check_int(name, getattr(self, name), minimum=1)
        for name in ("min_tool_run", "mask_keep"):
            _check_int(name, getattr(self, name), minimum=0)
        _check_ratio("current_round_ratio", self.current_round_ratio)
        _check_int("reserve_tokens", self.reserve_tokens, minimum=0)
        if self.reserve_tokens > self.max_tokens // 2:
            what = "AutoContextConfig.reserve_tokens"
            if not _given(self.reserve_tokens):
                what = "AutoContextConfig: the measured tools and instructions"
            raise ConfigError(
                f"{what} ({self.reserve_tokens}) must be at most half of max_tokens "
                f"({self.max_tokens}): the messages need the rest of the window; raise max_tokens "
                "or send fewer tool definitions"
            )
        if not isinstance(self.fact_repair, bool):
            raise ConfigError(
                "AutoContextConfig.fact_repair must be True or False, got "
                f"{type(self.fact_repair).__name__}"
            )
        _check_share("fact_index_ratio", self.fact_index_ratio)
        self._derive_ratios()
        self._derive_payload_sizes()
        self._derive_mask_sizes()
        self._derive_window_sizes()
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
        try:
            validate_search_config(self.search_config)
        except ValueError as exc:
            raise ConfigError(f"AutoContextConfig.{exc}") from None

    # -- derived defaults -----------------------------------------------------------------------

    def _set(self, name: str, value: int | float) -> None:
        # The dataclass is frozen: the derived defaults are filled in once, here.
        object.__setattr__(self, name, value)

    def _derive_ratios(self) -> None:
        trigger_given, target_given = _given(self.token_ratio), _given(self.target_ratio)
        if trigger_given:
            _check_ratio("token_ratio", self.token_ratio)
        if target_given:
            _check_ratio("target_ratio", self.target_ratio)
        if trigger_given and target_given:
            if self.target_ratio >= self.token_ratio:
                raise ConfigError(
                    f"AutoContextConfig.target_ratio ({self.target_ratio}) must be below "
                    f"token_ratio ({self.token_ratio}): the target has to sit under the trigger"
                )
        elif trigger_given:
            ratio = self.token_ratio
            self._set("target_ratio", _DerivedRatio(min(_TARGET_RATIO, 0.8 * ratio)))
        elif target_given:
            ratio = self.target_ratio
            trigger = _TOKEN_RATIO if ratio < _TOKEN_RATIO else (1 + ratio) / 2
            self._set("token_ratio", _DerivedRatio(trigger))
        else:
            self._set("token_ratio", _DerivedRatio(_TOKEN_RATIO))
            self._set("target_ratio", _DerivedRatio(_TARGET_RATIO))

    def _derive_payload_sizes(self) -> None:
        large = self.large_payload_chars
        if _given(self.preview_chars):
            _check_int("preview_chars", self.preview_chars, minimum=1)
            if self.preview_chars >= large:
                raise ConfigError(
                    f"AutoContextConfig.preview_chars ({self.preview_chars}) must be smaller "
                    f"than large_payload_chars ({large}): a preview longer than the large "
                    "threshold would itself count as large"
                )
        else:
            self._set("preview_chars", _Derived(max(1, min(_PREVIEW_CHARS, large // 2))))
        if _given(self.reload_page_chars):
            _check_int("reload_page_chars", self.reload_page_chars, minimum=1)
            if self.reload_page_chars > large:
                raise ConfigError(
                    f"AutoContextConfig.reload_page_chars ({self.reload_page_chars}) must not "
                    f"exceed large_payload_chars ({large}), or a reloaded page would be "
                    "offloaded again"
                )
        else:
            self._set("reload_page_chars", _Derived(min(_RELOAD_PAGE_CHARS, large)))
        if _given(self.transcript_clip_chars):
            _check_int("transcript_clip_chars", self.transcript_clip_chars, minimum=1)
        else:
            self._set("transcript_clip_chars", _Derived(max(1, large // _CLIP_PER_LARGE)))

    def _derive_mask_sizes(self) -> None:
        _check_int("mask_preview_chars", self.mask_preview_chars, minimum=1)
        if self.mask_ratio is not None:
            _check_share("mask_ratio", self.mask_ratio)
        _check_int("mask_fact_chars", self.mask_fact_chars, minimum=0)
        if _given(self.mask_min_chars):
            _check_int("mask_min_chars", self.mask_min_chars, minimum=1)
            if self.mask_min_chars <= self.mask_preview_chars:
                raise ConfigError(
                    f"AutoContextConfig.mask_min_chars ({self.mask_min_chars}) must be larger "
                    f"than mask_preview_chars ({self.mask_preview_chars}): a masked output must "
                    "be longer than its preview"
                )
        else:
            minimum = _MASK_MIN_PER_PREVIEW * self.mask_preview_chars
            self._set("mask_min_chars", _Derived(min(minimum, _MAX_INT)))

    def _derive_window_sizes(self) -> None:
        if _given(self.last_keep):
            _check_int("last_keep", self.last_keep, minimum=0)
        else:
            keep = _LAST_KEEP_AT_REFERENCE * self.max_tokens / REFERENCE_WINDOW
            self._set("last_keep", _Derived(max(_LAST_KEEP_MIN, round(keep))))
        if _given(self.min_compress_tokens):
            _check_int("min_compress_tokens", self.min_compress_tokens, minimum=0)
        else:
            floor = _MIN_COMPRESS_TOKENS_AT_REFERENCE * self.max_tokens / REFERENCE_WINDOW
            self._set("min_compress_tokens", _Derived(round(floor)))
        target = self.token_target
        keep_given, budget_given = _given(self.fold_keep_tokens), _given(self.fold_budget_tokens)
        if keep_given:
            _check_int("fold_keep_tokens", self.fold_keep_tokens, minimum=0)
        if budget_given:
            _check_int("fold_budget_tokens", self.fold_budget_tokens, minimum=1)
        if not keep_given:
            room = target - (self.fold_budget_tokens if budget_given else 0) - 1
            keep = min(int(target * _FOLD_KEEP_SHARE), room)
            self._set("fold_keep_tokens", _Derived(max(0, keep)))
        if not budget_given:
            room = target - self.fold_keep_tokens - 1
            budget = min(int(target * _FOLD_BUDGET_SHARE), room)
            self._set("fold_budget_tokens", _Derived(max(1, budget)))
        if self.fold_keep_tokens + self.fold_budget_tokens >= target:
            names = [
                n
                for n, g in (("fold_keep_tokens", keep_given), ("fold_budget_tokens", budget_given))
                if g
            ]
            raise ConfigError(
                f"AutoContextConfig.{' + '.join(names)}: fold_keep_tokens "
                f"({self.fold_keep_tokens}) plus fold_budget_tokens ({self.fold_budget_tokens}) "
                f"must stay under the token target ({target} = max_tokens * target_ratio), or "
                "a fold could never reach the target"
            )

    # -- what the thresholds mean ---------------------------------------------------------------

    @property
    def message_window(self) -> int:
        """The window less `reserve_tokens`: what the working context may fill. The bound
        keeps the working context under it; the triggers and targets are shares of it."""
        return self.max_tokens - self.reserve_tokens

    @property
    def token_trigger(self) -> int:
        """Working tokens at which compression starts."""
        return int(self.message_window * self.token_ratio)

    @property
    def mask_trigger(self) -> int | None:
        """Working tokens at which masking may run alone (None: only in a compression)."""
        if self.mask_ratio is None:
            return None
        return int(self.message_window * self.mask_ratio)

    @property
    def token_target(self) -> int:
        """Working tokens under which compression stops."""
        return int(self.message_window * self.target_ratio)

    @property
    def msg_target(self) -> int | None:
        """Working messages under which compression stops; None without a count trigger."""
        if self.msg_threshold is None:
            return None
        return int(self.msg_threshold * self.target_ratio)

    @property
    def derived(self) -> tuple[str, ...]:
        """The fields whose values were derived (not set by the caller)."""
        return tuple(n for n in DERIVED_FIELDS if not _given(getattr(self, n)))

    def to_json(self) -> dict[str, Any]:
        """The thresholds as recorded on the session row and on each event: every value in
        force, and which of them were derived (so that `from_json` derives them again)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in DERIVED_FIELDS:
            value = data[name]
            data[name] = float(value) if isinstance(value, float) else int(value)
        data["prompts"] = {str(k): v for k, v in self.prompts.items()}
        data["derived"] = list(self.derived)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AutoContextConfig:
        """The config `to_json` wrote. Keys it does not know are left out: a session stored
        before the runtime options moved to `RuntimeOptions` (and `auto_upgrade` to the
        client) carries them, and still opens; the process's own options apply."""
        known = {f.name for f in dataclasses.fields(cls)}
        derived = set(data.get("derived", ()))
        kwargs = {k: v for k, v in data.items() if k in known and k not in derived}
        measured = data.get("reserve_tokens")
        if "reserve_tokens" in derived and type(measured) is int:
            # Derived from a measure (`reserve_for`), not from other fields: kept as measured.
            kwargs["reserve_tokens"] = _Derived(measured)
        if "prompts" in kwargs:
            kwargs["prompts"] = {int(k): v for k, v in kwargs["prompts"].items()}
        return cls(**kwargs)


def config_changes(stored: object, config: AutoContextConfig) -> list[str]:
    """What `config` changes of the config recorded on a session (`stored`, its JSON), one
    ``name old -> new`` per field the caller's open changes, for the warning of
    docs/design.md §8 (a prompt is named, never quoted). Empty when nothing changes, or when
    the record is not a config (it is then repaired, not changed)."""
    if not isinstance(stored, Mapping):
        return []
    new = config.to_json()
    # A size derived on both sides follows a field that is itself named, if it moved.
    followed = set(new["derived"]) & set(stored.get("derived", ()))
    changes = []
    for name, value in new.items():
        if name in ("derived", *followed) or name not in stored or stored[name] == value:
            continue
        if name == "prompts":
            changes.append("prompts")
        else:
            changes.append(f"{name} {stored[name]!r} -> {value!r}")
    return changes


def config_argument(config: object) -> AutoContextConfig | None:
    """The `config=` given to `open`: an `AutoContextConfig` or None (`ConfigError` else)."""
    if config is None or isinstance(config, AutoContextConfig):
        return config
    hint = " (AutoContextConfig(**that_dict))" if isinstance(config, Mapping) else ""
    raise ConfigError(
        f"config must be an AutoContextConfig or None, got {type(config).__name__}; build one"
        f"{hint} and pass it"
    )


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """How this process runs a compression: bounds, deadlines, concurrency and what a failure
    does. Given to `AutoContextMemory.open` (`options=`), `AutoContextClient.open` and
    `AutoContextWorker`; never stored with a session, so that two processes compressing one
    session each keep their own (a worker may allow a slower summarizer than an agent).

    >>> AutoContextMemory.open("agent-42", options=RuntimeOptions(strict=True))
    """

    #: Passes of the ladder per `compress_if_needed()` call (each applies one strategy).
    max_passes: int = 10
    #: Summarizer calls per `compress_if_needed()` call.
    max_llm_calls: int = 8
    #: Seconds one summarizer call may take in all (every retry and a slow stream included);
    #: a call past it is a `failed` event, never a summary.
    summarizer_deadline_s: float = DEFAULT_SUMMARIZER_DEADLINE_S
    #: Seconds one `compress_if_needed()` call may spend on summarizer calls; past it, no
    #: further call starts (a call in flight is cut at it) and the offline fallback keeps the
    #: context under the window.
    compress_deadline_s: float = DEFAULT_COMPRESS_DEADLINE_S
    #: Summarizer calls one pass may have in flight at once: the independent ranges of a
    #: strategy (S1's runs, S4's rounds, S5's messages) are summarized concurrently, up to
    #: this many at a time (1: one after the other), and still commit in one transaction.
    summarizer_concurrency: int = 4
    #: Raise summarizer failures instead of recording them as `failed` events, and make
    #: `to_openai()` / `to_anthropic()` of a context over its window raise
    #: `ContextOverWindow` instead of logging a warning (docs/design.md §2).
    strict: bool = False

    def __post_init__(self) -> None:
        for name in ("max_passes", "summarizer_concurrency"):
            _check_int(name, getattr(self, name), minimum=1, owner=_OPTIONS)
        _check_int("max_llm_calls", self.max_llm_calls, minimum=0, owner=_OPTIONS)
        for name in ("summarizer_deadline_s", "compress_deadline_s"):
            _arguments.seconds(name, getattr(self, name), owner=_OPTIONS)
        if not isinstance(self.strict, bool):
            raise ConfigError(
                f"RuntimeOptions.strict must be True or False, got {type(self.strict).__name__}"
            )


_OPTIONS: Final = "RuntimeOptions"
#: What `AutoContextConfig` held before the split, and where each moved (docs/design.md §8).
MOVED_FIELDS: Final = {
    **{f.name: _OPTIONS for f in dataclasses.fields(RuntimeOptions)},
    "auto_upgrade": "the client",
}


def options_argument(options: object) -> RuntimeOptions:
    """The `options=` given to `open` (None: the defaults); `ConfigError` for anything else."""
    if options is None:
        return RuntimeOptions()
    if isinstance(options, RuntimeOptions):
        return options
    raise ConfigError(
        f"options must be a RuntimeOptions or None, got {type(options).__name__}; build one "
        "(RuntimeOptions(max_passes=..., strict=...)) and pass it"
    )


def _moved(name: str) -> str:
    """The error message for a keyword that left `AutoContextConfig`."""
    if MOVED_FIELDS[name] == _OPTIONS:
        return (
            f"AutoContextConfig.{name} moved to RuntimeOptions (it is how this process runs a "
            f"compression, not a threshold stored with the session): pass "
            f"options=RuntimeOptions({name}=...) to AutoContextMemory.open, "
            "AutoContextClient.open or AutoContextWorker"
        )
    return (
        f"AutoContextConfig.{name} moved to the client (it decides for the database, not for "
        f"a session): pass {name}=... to AutoContextMemory.open or AutoContextClient(...)"
    )


def stored_config(session_id: str, data: object) -> AutoContextConfig:
    """The config recorded on session `session_id`, read back from the database, where anyone
    with the tables' privileges (or an import) may have written anything: `InvalidStoredConfig`
    naming the session, the field and the fix when it is not a valid config. The message
    names the field, never its value."""
    try:
        if not isinstance(data, Mapping):
            raise TypeError("not a JSON object")
        return AutoContextConfig.from_json(data)
    except (ConfigError, TypeError, ValueError, AttributeError, KeyError) as exc:
        found = re.match(r"AutoContextConfig(?:\.| has no field ')(\w+)", str(exc))
        field = f"field {found.group(1)!r}" if found else "its shape"
        raise InvalidStoredConfig(
            f"session {session_id!r}: the config recorded on it is invalid ({field}), so it is "
            "not compressed. Open it once with config=AutoContextConfig(...) (the thresholds to "
            "record), or rewrite sessions.config with the tables' owner; its messages are "
            "untouched"
        ) from None


#: Every integer field is a count of tokens, characters, messages or calls: a 32-bit integer
#: holds any sound value, and a bound keeps the window-derived sizes computable (a config read
#: back from the database may hold a number of any size).
_MAX_INT: Final = 2**31 - 1


def _check_int(name: str, value: object, *, minimum: int, owner: str = "AutoContextConfig") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        rule = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigError(f"{owner}.{name} must be {rule}, got {value!r}")
    if value > _MAX_INT:
        raise ConfigError(f"{owner}.{name} must be at most {_MAX_INT:,}")


def _check_ratio(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ConfigError(
            f"AutoContextConfig.{name} must be a number strictly between 0 and 1, got {value!r}"
        )


def _check_share(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ConfigError(
            f"AutoContextConfig.{name} must be a number from 0 up to (not including) 1, got "
            f"{value!r}"
        )


def _named_fields_only(init: Any) -> Any:
    """Wrap the generated `__init__` so that a misspelt field (`max_token=`) is a `ConfigError`
    that says which field was meant, not a bare `TypeError`."""

    @functools.wraps(init)
    def checked(self: AutoContextConfig, *args: Any, **kwargs: Any) -> None:
        names = [f.name for f in dataclasses.fields(AutoContextConfig)]
        for key in kwargs:
            if key in MOVED_FIELDS:
                raise ConfigError(_moved(key))
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; the fields are {names}"
                raise ConfigError(f"AutoContextConfig has no field {key!r}{hint}")
        init(self, *args, **kwargs)

    return checked


# The dataclass writes `__init__`; the check goes around it (`dataclasses.replace` passes
# through it too, with known names only).
AutoContextConfig.__init__ = _named_fields_only(AutoContextConfig.__init__)  # type: ignore[method-assign]
