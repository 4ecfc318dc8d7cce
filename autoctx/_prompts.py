"""autoctx's own prompt texts, the request builder, and the snippet that explains tags to agents.

The LLM strategies (docs/design.md §3: 1, 4, 5, 6 and the fold, 7) each have a default prompt
here; a caller replaces any of them through ``AutoContextConfig.prompts``. The prompt goes out as
the system message; the user message is the transcript, then the character budget when there is
one, then the plan hint, always last (see `SummaryRequest.user_content`).

The prompts ask for plain text and never show the offload tag: a model shown the tag tends to
reproduce it, and an answer carrying one is refused (reason ``tag_in_answer``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from ._agent_plan import plan_hint
from ._config import LLM_STRATEGIES, AutoContextConfig
from ._errors import ConfigError
from ._messages import Msg
from ._summary import CHARS_PER_BUDGET_TOKEN, SummaryRequest
from ._tags import offload_tag
from ._transcript import Clip, original_chars, render_transcript

__all__ = [
    "DEFAULT_PROMPTS",
    "RELOAD_SNIPPET",
    "build_request",
    "clip_for",
    "prompt_for",
]

# Shared by every prompt: what the output must look like.
_FORM = (
    "Write plain text only: short lines or simple '-' bullets, no tables, no headings, no "
    "HTML, no comments, no markup of any kind. Copy names, paths, identifiers, numbers and "
    "error messages exactly as they appear; never invent, round or guess a value. If the "
    "transcript mentions offloaded context by its id, you may keep that reference as written. "
    "Long outputs appear only by their beginning and end, the cut marked [TRUNCATED: ...]; the "
    "agent can reload them whole, so never guess what was left out."
)

_S1_TOOL_RUNS: Final = f"""\
You compress the record of a finished stretch of tool work done by an AI agent, so that the
agent can continue without the raw output. The transcript lists each tool call (tool name, call
id, arguments) and each result.

Write a factual record that keeps:
- every tool that was used, by its exact name, with its exact arguments (paths, queries,
  commands, keys, flags);
- the facts each result established: values read, matches found, listings, versions, counts,
  exit codes, the exact text of every error;
- every write or other side effect: the file paths, keys, records or resources touched, the
  state change made, and whether it succeeded or failed;
- identical calls repeated with identical results only once, followed by how many times they
  ran (for example "x3");
- the marker [TRUNCATED] next to any result whose output was cut off in the transcript.

Leave out chatter and raw bulk that carries no fact. Keep the order in which things happened
when it matters. {_FORM}"""

_S4_ROUND: Final = f"""\
You rewrite the final answer of a finished exchange between a user and an AI agent. The
transcript holds everything the agent did between the user's request and its answer; the
user's request itself stays in the conversation and is not part of your reply.

Write the reply the agent should have given: a self-contained answer to the user that also
carries every fact the agent learned on the way and may need later:
- file paths and the relevant parts of their contents;
- exact error messages, ids, URLs, hostnames, ports, status codes and configuration values;
- the result of each write or change (what was changed, where, and whether it worked);
- the state of every service, process or resource involved.

Speak as the agent answering the user. Do not narrate tools, calls or steps ("I ran...",
"then I called..."); state what is true and what was done. If the exchange ended without an
answer (the user moved on), say what was done, what was found and what was left open. {_FORM}"""

_S5_PAYLOAD: Final = f"""\
You shorten one very large message from an AI agent's ongoing work: a tool output, the
arguments of a tool call, or a long piece of text. The agent is still working and will rely on
your version instead of the original.

Be conservative: keep every key fact, result and status, every error verbatim, every
identifier, path, URL, number and setting that could matter, and the tool names, call ids and
key arguments the message refers to. Drop only repetition, boilerplate and bulk that carries no
information; say briefly what kind of bulk was dropped (for example "412 similar log lines
omitted"). Mark with [TRUNCATED] anything the original itself shows as cut off. {_FORM}"""

_S6_CURRENT_ROUND: Final = f"""\
You condense the work an AI agent has done so far on the user's current request, so that the
agent can continue from your text alone. The transcript is the agent's own calls, results and
notes since the request.

Write in the first person, as the agent's own working notes, in the order things happened:
"I called <tool> with <key arguments>; it returned <facts>." Keep exact tool names, arguments,
paths, ids, values and error messages, every change the agent made and whether it worked, what
is known to be true now, and what was still open or failing. Merge repeated identical calls
with a count. Stay within the character budget given after the transcript: drop the least
useful detail first, never the facts the next step depends on. {_FORM}"""

_S7_FOLD: Final = f"""\
You maintain the running memory of a long conversation between a user and an AI agent. The
transcript holds the older part of the conversation: the user's requests, the agent's answers
and tool work, and earlier summaries of it (an earlier summary of the whole history may come
first: carry everything in it that still matters forward). The most recent exchanges stay in
the conversation and are not part of the transcript.

Write one summary that the user and the agent need to continue, within the length budget given
after the transcript:
- the user's goals and standing instructions, preferences and constraints;
- decisions made, with their reasons;
- facts learned: file paths, ids, names, URLs, ports, values, exact errors, and the result of
  every write or change (what, where, whether it worked);
- what is done and what is still open, failing or promised;
- the ids of offloaded context that hold details worth reloading (written as in the
  transcript), next to what they hold.
Prefer the facts most likely to be needed again; drop pleasantries and detail that no later
step depends on. {_FORM}"""

#: Autoctx's own prompt for each LLM strategy (docs/design.md §3).
DEFAULT_PROMPTS: Final[Mapping[int, str]] = {
    1: _S1_TOOL_RUNS,
    4: _S4_ROUND,
    5: _S5_PAYLOAD,
    6: _S6_CURRENT_ROUND,
    7: _S7_FOLD,
}

#: For the agent's system prompt: what the tags mean and how to get the originals back.
RELOAD_SNIPPET: Final = f"""\
Parts of this conversation may have been compressed to keep it within the context window.
A compressed part is a summary or a shortened preview that ends with a tag of the form
{offload_tag("<uuid>")}. Nothing is lost: the original messages behind it are stored.
When you need exact details that a summary or preview leaves out (full file contents, complete
tool output, exact values), call the context_reload tool with the uuid from that tag; it returns
the original messages as text, page by page when they are long. Reload only what you need, and
never write such a tag yourself.
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
    if strategy == 5:
        whole = _S5_CLIP_PER_LARGE * config.large_payload_chars
        return Clip(tool_chars=whole, text_chars=whole)
    total = None
    if strategy == 7:
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
