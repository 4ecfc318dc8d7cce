"""The summarizer request builder, and the snippet that explains tags to agents.

Each LLM rung has a default prompt (its record in `autoctx._strategies.registry`, the texts in
`autoctx._prompt_texts`); a caller replaces any of them through ``AutoContextConfig.prompts``.
The prompt goes out as the system message; the user message is the transcript, then the
character budget when there is one, then the plan hint, always last (see
`SummaryRequest.user_content`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from ._agent_plan import plan_hint
from ._config import AutoContextConfig
from ._errors import ConfigError
from ._messages import Msg
from ._prompt_texts import S5_SHARED
from ._shared_requests import join_parts
from ._strategies.registry import DEFAULT_PROMPTS, FOLD, LARGE, LLM_STRATEGIES
from ._summary import CHARS_PER_BUDGET_TOKEN, SummaryRequest
from ._tags import offload_tag
from ._transcript import Clip, original_chars, render_transcript

__all__ = [
    "DEFAULT_PROMPTS",
    "RELOAD_SNIPPET",
    "build_request",
    "build_shared_request",
    "clip_for",
    "prompt_for",
    "shared_input_bound",
    "shares_requests",
]

#: For the agent's system prompt: what the tags mean and how to get the originals back.
RELOAD_SNIPPET: Final = f"""\
Parts of this conversation may have been compressed to keep it within the context window.
A compressed part is a summary or a shortened preview that ends with a tag of the form
{offload_tag("N")}. Nothing is lost: the original messages behind it are stored.
When you need exact details that a summary or preview leaves out (full file contents, complete
tool output, exact values), call the context_reload tool with the number N from that tag (as
offload); it returns the original messages as text, page by page when they are long. Reload
only what you need, and never write such a tag yourself.
If you have the context_search tool, use it to find what you knew but no longer see: words, ids
or paths from earlier in this conversation, or, with scope "tenant", from your earlier
sessions. Each hit shows a short extract and how to read the whole message with context_reload
(its message_id, and its session_id when it comes from another session)."""


def prompt_for(strategy: int, overrides: Mapping[int, str] | None = None) -> str:
    """The prompt for an LLM strategy: the caller's override when given, else autoctx's own."""
    if strategy not in LLM_STRATEGIES:
        raise ConfigError(
            f"strategy {strategy} has no prompt; only the LLM strategies {LLM_STRATEGIES} do"
        )
    if overrides and strategy in overrides:
        return overrides[strategy]
    return DEFAULT_PROMPTS[strategy]


#: S5's subject is one large message: it sees up to this many times `large_payload_chars` of
#: it (head and tail), which bounds what a pasted megabyte costs without starving the summary.
_S5_CLIP_PER_LARGE: Final = 4


#: The fold reads at most this many times what it may write (its token budget, at the
#: characters per token the request states it in): its summary keeps about a tenth of the
#: token target whatever the history held, so the rest of a longer transcript is paid for
#: and dropped; the cut falls on the longest entries, and everything stays reloadable.
_FOLD_READS_PER_BUDGET: Final = 4


def clip_for(strategy: int, config: AutoContextConfig) -> Clip:
    """How much of each entry the summarizer sees for `strategy` (see `Clip`).

    Every range sent to the summarizer is offloaded whole, so a summary need not carry the
    bulk of a tool output: S1, S4, S6 and the fold see `transcript_clip_chars` of each tool
    output and tool-call arguments, and `large_payload_chars` of any other text (rarely cut:
    S2 and S3 preview large messages of the history first). The fold's whole transcript is
    held to four times its budget (the longest entries of original messages cut first, to one
    common length; earlier summaries stay whole). S5, whose subject is one large message,
    sees up to four times `large_payload_chars` of it.
    """
    if strategy == LARGE:
        whole = _S5_CLIP_PER_LARGE * config.large_payload_chars
        return Clip(tool_chars=whole, text_chars=whole)
    total = None
    if strategy == FOLD:
        total = _FOLD_READS_PER_BUDGET * config.fold_budget_tokens * CHARS_PER_BUDGET_TOKEN
    return Clip(
        tool_chars=config.transcript_clip_chars,
        text_chars=config.large_payload_chars,
        total_chars=total,
    )


def build_request(
    strategy: int,
    messages: Sequence[Msg],
    *,
    prompts: Mapping[int, str] | None = None,
    char_budget: int | None = None,
    token_budget: int | None = None,
    plan: Mapping[str, Any] | None = None,
    deadline: float | None = None,
    clip: Clip | None = None,
    count_tokens: Callable[[str], int] | None = None,
) -> SummaryRequest:
    """The summarizer request for `messages` under `strategy`.

    Fills the plain-text transcript (its long entries cut as `clip` says, see `clip_for`),
    the original size (characters of text, tool-input JSON and outputs, before any cut), the
    character budget, the plan hint and the deadline (a `time.monotonic()` instant). Raises
    `ConfigError` for a strategy with no prompt and `autoctx._errors.InvalidPlan` for a
    malformed plan.
    """
    if char_budget is not None and char_budget <= 0:
        raise ValueError(f"char_budget must be positive, got {char_budget}")
    if token_budget is not None and token_budget <= 0:
        raise ValueError(f"token_budget must be positive, got {token_budget}")
    return SummaryRequest(
        strategy=strategy,
        prompt=prompt_for(strategy, prompts),
        transcript=render_transcript(messages, clip=clip),
        input_chars=original_chars(messages),
        char_budget=char_budget,
        plan_hint=plan_hint(plan),
        token_budget=token_budget,
        deadline=deadline,
        count_tokens=count_tokens if token_budget is not None else None,
    )


def shares_requests(strategy: int, config: AutoContextConfig) -> bool:
    """Whether the ranges `strategy` plans in one pass may share a summarizer request: S5's
    messages, under autoctx's own prompt (docs/design.md §3). A caller's S5 prompt speaks of
    one message and knows nothing of the shared request's headers, so each message then keeps
    a request of its own."""
    return strategy == LARGE and not (config.prompts and LARGE in config.prompts)


def shared_input_bound(config: AutoContextConfig) -> int:
    """The input bound of an S5 request, in characters: what one S5 request reads of a single
    message at most (`clip_for`). Messages share a request while their characters, each
    counted up to the bound, add up to no more than it, so that a shared request never reads
    more than the largest single one; a message that alone reaches it goes alone."""
    return _S5_CLIP_PER_LARGE * config.large_payload_chars


def build_shared_request(
    parts: Sequence[Sequence[Msg]],
    *,
    plan: Mapping[str, Any] | None = None,
    deadline: float | None = None,
    clip: Clip | None = None,
) -> SummaryRequest:
    """One S5 request for several messages, each part the messages one summary is asked for
    (one message, or what S5 summarizes of the current user message): the shared prompt, the
    parts' transcripts under their headers (`autoctx._shared_requests`), the plan hint last."""
    if len(parts) < 2:
        raise ValueError(f"a shared request holds at least two parts, got {len(parts)}")
    chars = [original_chars(p) for p in parts]
    return SummaryRequest(
        strategy=LARGE,
        prompt=S5_SHARED,
        transcript=join_parts([render_transcript(p, clip=clip) for p in parts], chars),
        input_chars=sum(chars),
        plan_hint=plan_hint(plan),
        deadline=deadline,
        parts=len(parts),
    )
