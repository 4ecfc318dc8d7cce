"""autoctx's own prompt texts for the LLM rungs (docs/design.md §3), in its own words.

The registry (`autoctx._strategies.registry`) gives each LLM rung its text as the rung's
default prompt; a caller replaces any of them through ``AutoContextConfig.prompts``. The
prompts ask for plain text and never show the offload tag: a model shown the tag tends to
reproduce it, and an answer carrying one is refused (reason ``tag_in_answer``).
"""

from __future__ import annotations

from typing import Final

#: Shared by every prompt: what the output must look like.
FORM: Final = (
    "Write plain text only: short lines or simple '-' bullets, no tables, no headings, no "
    "HTML, no comments, no markup of any kind. Copy names, paths, identifiers, numbers and "
    "error messages exactly as they appear; never invent, round or guess a value. If the "
    "transcript mentions offloaded context by its id, you may keep that reference as written. "
    "Long outputs appear only by their beginning and end, the cut marked [TRUNCATED: ...]; the "
    "agent can reload them whole, so never guess what was left out."
)

S1_TOOL_RUNS: Final = f"""\
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
when it matters. {FORM}"""

S4_ROUND: Final = f"""\
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
answer (the user moved on), say what was done, what was found and what was left open. {FORM}"""

S5_PAYLOAD: Final = f"""\
You shorten one very large message from an AI agent's ongoing work: a tool output, the
arguments of a tool call, or a long piece of text. The agent is still working and will rely on
your version instead of the original.

Be conservative: keep every key fact, result and status, every error verbatim, every
identifier, path, URL, number and setting that could matter, and the tool names, call ids and
key arguments the message refers to. Drop only repetition, boilerplate and bulk that carries no
information; say briefly what kind of bulk was dropped (for example "412 similar log lines
omitted"). Mark with [TRUNCATED] anything the original itself shows as cut off. {FORM}"""

S5_SHARED: Final = f"""\
You shorten several very large messages from an AI agent's ongoing work, each on its own: tool
outputs, the arguments of tool calls, or long pieces of text. The agent is still working and
will rely on your versions instead of the originals. The transcript holds the messages one after
the other, each under a line of the form "=== MESSAGE 2 of 3 (8000 characters) ===".

Answer with one summary per message, in their order, each under a line that holds only
"=== SUMMARY " followed by the message's number and " ===" (for example "=== SUMMARY 2 ==="),
and nothing before the first such line. Every message gets its summary, even a short one; never
merge two messages, never move a fact from one message's summary to another's: each summary
replaces only its own message.

Be conservative: in each summary keep every key fact, result and status, every error verbatim,
every identifier, path, URL, number and setting that could matter, and the tool names, call ids
and key arguments the message refers to. Drop only repetition, boilerplate and bulk that carries
no information; say briefly what kind of bulk was dropped (for example "412 similar log lines
omitted"). Mark with [TRUNCATED] anything the original itself shows as cut off. {FORM}"""

S6_CURRENT_ROUND: Final = f"""\
You condense the work an AI agent has done so far on the user's current request, so that the
agent can continue from your text alone. The transcript is the agent's own calls, results and
notes since the request.

Write in the first person, as the agent's own working notes, in the order things happened:
"I called <tool> with <key arguments>; it returned <facts>." Keep exact tool names, arguments,
paths, ids, values and error messages, every change the agent made and whether it worked, what
is known to be true now, and what was still open or failing. Merge repeated identical calls
with a count. Stay within the character budget given after the transcript: drop the least
useful detail first, never the facts the next step depends on. {FORM}"""

S7_FOLD: Final = f"""\
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
step depends on. {FORM}"""

#: The repair request of the fact check (docs/design.md §6): the summary, the facts of the
#: original it lacks, and the budget it must stay within.
REPAIR_PROMPT: Final = f"""\
You revise a summary of an AI agent's working context. The summary left out some facts of the
original that the agent may need. Rewrite the summary so that it states each listed fact
exactly as written (character for character: paths, ids, values, errors and the user's
instructions), next to what it belongs to, and keeps everything else the summary says. Stay
within the budget given: shorten the least useful wording to make room, never drop a listed
fact. Answer with the revised summary only. {FORM}"""
