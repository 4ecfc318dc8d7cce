"""What does an agent pay for its context, with autoctx and with its peers' compaction?

The same seeded agent workloads are replayed, one model call at a time, through five systems
driven as their frameworks drive them, with one shared deterministic summarizer (autoctx's
`OfflineSummarizer` behind a local OpenAI-protocol HTTP server, `_summary_server.py`, which
every system reaches through its own client). Every system compacts at 0.75 W:

- `autoctx`: `AutoContextMemory` with `AutoContextConfig(max_tokens=W)`,
  `compress_if_needed()` before every model call, the summarizer an `OpenAISummarizer` pointed
  at the server (its default early masking, no LLM, starts at 0.15 W: docs/design.md §3);
- `langchain`: `create_agent` with `SummarizationMiddleware(ChatOpenAI(base_url=server,
  profile={"max_input_tokens": W}), trigger=("fraction", 0.75))` and its other defaults (keep
  20 messages, trim 4,000 tokens to summarize, the approximate token counter), an in-memory
  checkpointer (one thread, one `invoke` per user turn), a scripted chat model that replays the
  workload's responses (with the usage a provider reports) and tools that return its outputs;
- `langchain-mask`: the same agent with observation masking first, `ContextEditingMiddleware(
  edits=[ClearToolUsesEdit(trigger=0.75 W, keep=3)])`, and the summarization as its fallback.
  The summarization is a `before_model` hook on the agent's state, which the edit (a
  `wrap_model_call` hook) leaves unmasked, so by itself it would fire at every pass of its
  trigger and the edit would never spare a call; the adapter is its documented `token_counter`
  parameter, given a counter that applies the same edit to a copy before counting. Both count
  with the bench's tokenizer (the default approximate counter is scaled by the reported usage
  only in the summarization's copy, so the edit would fire after it);
- `tiered`: pydantic-ai-harness `TieredCompaction` over its documented tiers,
  `ClearToolResults(keep_pairs=3)` then `SummarizingCompaction(keep_messages=20)`, target
  0.75 W, on a pydantic-ai `Agent` whose model is a `FunctionModel` replaying the workload (with
  its usage) and whose summarizer is a `FunctionModel` that asks the summary server; one
  `run_sync` per user turn, each continuing the last one's (compacted) history;
- `openhands`: the SDK's `default_condenser()` settings (`LLMSummarizingCondenser`, max_size
  80, keep_first 4) with ``max_tokens`` 0.75 W, called through `prepare_llm_messages` as
  `Agent.step` calls it, in a child process of a Python 3.12+ interpreter
  (`--openhands-python`, see `_openhands_driver.py`).

A system whose packages are not importable is skipped, and the output says so.

Workloads (every tool output carries one unique fact marker, ``fact_id=F<n>-<hex>``, on a line
at a random place in it): `toolchat` (400 Agents-SDK-like turns, W = 16,000), `longtask` (one
task of 400 tool steps, W = 32,000), `bigtask` (one task of 300 tool steps whose outputs are
all 500 to 8,000 characters, W = 32,000), `multitask` (12 tasks of 10 to 120 steps in one session,
W = 32,000), `chat` (600 small rounds, a quarter of them with one tool call, W = 16,000),
`coding-agent` (240 tool steps of mostly short shell results and a few 50-150 KB dumps, one
task and one follow-up, W = 128,000), `support-agent` (60 user turns answered with small JSON
records, the user restating constraints, W = 16,000), and
`trajectories` (`--trajectories DIR`: JSON/JSONL files of OpenAI-format chat messages, W from
`--window`).

Per system and workload: the peak of the model's input (x W) and the model calls over W;
summarizer calls and tokens in/out (counted by the server, tiktoken o200k_base); the agent's
input summed over its model calls, and billed with an ideal prompt cache (the longest prefix,
in whole messages, equal to the previous call's input billed at 10%), and the cached share
(the tokens of those prefixes over all the agent's input), and the re-billed tokens (those
the previous call had sent too but that follow the first message an edit changed, so this call
pays them in full: what compressions cost the cache besides the new messages); total cost =
agent input billed + summarizer input + 4 x summarizer output (in input-token equivalents); the fact
markers verbatim in the final input and, for autoctx, reachable by `mem.reload` of the offload
ids in it (recursively); wall time. Every input is counted the same way for every system
(tiktoken o200k_base over each message's text, tool output and tool calls, plus 4 per
message; a message a system made, such as autoctx's masked outputs, is counted as the model
reads it). `--autoctx-config JSON` runs autoctx with other config fields than the defaults. For
autoctx, a line per workload splits its compression events by strategy: applied, failed,
summarizer calls and their tokens in and out. Against the peers: each system's total cost over
the cheapest peer that stays under W (a peer with a call over W is shown, never the cheapest),
and its summarizer calls per ten saturated model calls (those whose uncompressed input, the
whole workload before them, is over 0.75 W); a last table puts autoctx against the cheapest
bounded peer and the bounded peer with the fewest summarizer calls, workload by workload.

    python bench/agent_cost.py --database-url postgresql://postgres@127.0.0.1:5432/postgres \\
        --openhands-python /path/to/py312-venv/bin/python --plot agent_cost.png
    python bench/agent_cost.py --quick --systems autoctx
    python bench/agent_cost.py --systems autoctx,langchain,langchain-mask,tiered \\
        --workloads toolchat,bigtask
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import math
import os
import re
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from _common import (
    TOOL_OUTPUT_KINDS,
    BenchDatabase,
    Calls,
    Texts,
    TranscriptGenerator,
    add_config_argument,
    add_database_argument,
    fresh_database,
    machine_description,
    secs,
    tool_arguments,
    tool_turn,
    trajectories,
)
from _facts_visible import (
    CheckTally,
    LossySummarizer,
    Visible,
    check_cost,
    facts_in,
    visible_shares,
)
from _summary_server import SummaryServer
from rich.console import Console
from rich.table import Table

from autoctx import (
    AutoContextConfig,
    AutoContextMemory,
    Msg,
    OfflineSummarizer,
    OpenAISummarizer,
    ToolUseBlock,
    from_openai_messages,
)
from autoctx._tags import tag_ids
from autoctx._tokens import TokenCounter

console = Console(width=280)

WORKLOADS = (
    "toolchat",
    "longtask",
    "bigtask",
    "multitask",
    "chat",
    "coding-agent",
    "support-agent",
)
SYSTEMS = (
    "autoctx",
    "autoctx-offline",
    "autoctx-lossy",
    "langchain",
    "langchain-mask",
    "tiered",
    "openhands",
)
#: autoctx's runs: its summarizer on each (docs/design.md §6, the fact check's measure): the
#: shared summary server every system uses, the offline summarizer in process, and a lossy stub
#: that drops every fact it is given (the repair and the index line then keep them in view).
AUTOCTX_RUNS = {"autoctx": "shared", "autoctx-offline": "offline", "autoctx-lossy": "lossy"}
#: What each peer is, for the output (autoctx's own line says its summarizer).
PEERS = {
    "langchain": "LangChain SummarizationMiddleware",
    "langchain-mask": "LangChain ContextEditingMiddleware(ClearToolUsesEdit) + summarization",
    "tiered": "pydantic-ai-harness TieredCompaction(ClearToolResults, SummarizingCompaction)",
    "openhands": "OpenHands LLMSummarizingCondenser",
}
WINDOWS = {
    "toolchat": 16_000,
    "longtask": 32_000,
    "bigtask": 32_000,
    "multitask": 32_000,
    "chat": 16_000,
    "coding-agent": 128_000,
    "support-agent": 16_000,
}
# Full sizes, and --quick's.
SIZES = {
    "toolchat": 400,
    "longtask": 400,
    "bigtask": 300,
    "multitask": 12,
    "chat": 600,
    "coding-agent": 240,
    "support-agent": 60,
}
QUICK = {
    "toolchat": 60,
    "longtask": 80,
    "bigtask": 60,
    "multitask": 3,
    "chat": 80,
    "coding-agent": 60,
    "support-agent": 15,
}
#: The bigtask's tool outputs: 500 to 8,000 characters, log-uniform.
BIG_OUTPUT_CHARS = (500, 8_000)
#: coding-agent: most outputs are short shell results, log-uniform in this range; about one
#: step in 40 dumps a file or a test log of the huge range.
SHELL_OUTPUT_CHARS = (100, 2_000)
HUGE_OUTPUT_CHARS = (50_000, 150_000)
HUGE_SHARE = 1 / 40
#: support-agent: small JSON tool results.
JSON_OUTPUT_CHARS = (200, 1_500)
#: Where every system's compaction fires, as a share of W (LangChain's and OpenHands' settings
#: here, autoctx's default trigger).
TRIGGER = 0.75
CACHED_PRICE = 0.1
OUTPUT_PRICE = 4.0
FACT_RE = re.compile(r"fact_id=F\d{5}-[0-9a-f]{6}")
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
PER_MESSAGE_TOKENS = 4


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_database_argument(parser)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--trajectories", type=Path, help="a directory of JSON/JSONL trajectories")
    parser.add_argument("--window", type=int, default=32_000, help="W of the trajectories")
    parser.add_argument(
        "--openhands-python",
        default=os.environ.get("OPENHANDS_PYTHON"),
        help="a Python 3.12+ interpreter with openhands-sdk (default: $OPENHANDS_PYTHON)",
    )
    parser.add_argument(
        "--peers-from",
        type=Path,
        help="take the figures of the systems not run now from this earlier --json output (same "
        "seed, sizes and workloads): after a change to autoctx, `--systems autoctx --peers-from "
        "FILE` measures it against the peers without running them again",
    )
    add_config_argument(parser)
    parser.add_argument("--plot", type=Path, help="write the input tokens per call to this PNG")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    if args.trajectories is not None and "trajectories" not in names:
        names.append("trajectories")
    unknown = [n for n in names if n not in (*WORKLOADS, "trajectories")]
    if unknown:
        parser.error(f"unknown workloads {', '.join(unknown)}")
    if "trajectories" in names and args.trajectories is None:
        parser.error("the trajectories workload needs --trajectories DIR")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if bad := [s for s in systems if s not in SYSTEMS]:
        parser.error(f"unknown systems {', '.join(bad)}")
    args.names, args.system_names = names, systems
    return args


# ---------------------------------------------------------------------------------------------
# Workloads: OpenAI-format messages; the model is called before each assistant message
# ---------------------------------------------------------------------------------------------


@dataclass
class Workload:
    name: str
    window: int
    messages: list[dict[str, Any]]

    @property
    def model_calls(self) -> list[int]:
        """Where the model is called: before each assistant message, which is its answer, and
        at the end when the last message is not one (a trajectory cut short)."""
        points = [i for i, m in enumerate(self.messages) if m["role"] == "assistant"]
        if self.messages and self.messages[-1]["role"] != "assistant":
            points.append(len(self.messages))
        return points


def turns(w: Workload) -> Iterator[tuple[list[int], list[int]]]:
    """The user turns an agent framework runs: the user messages that open each (consecutive
    ones together, as one input: a trajectory's later system prompt becomes a user note just
    before its task) and the model calls up to the next turn. A turn cut short (its last call
    answered by tools, or the workload's end) gets a stub answer past the end of the workload,
    since the agent loop needs a final answer to stop; that call is not one of the workload's
    and is not counted."""
    msgs = w.messages
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    opens = [i for i in users if i == 0 or msgs[i - 1]["role"] != "user"]
    for n, start in enumerate(opens):
        end = opens[n + 1] if n + 1 < len(opens) else len(msgs) + 1
        inputs = [start]
        while inputs[-1] + 1 < len(msgs) and msgs[inputs[-1] + 1]["role"] == "user":
            inputs.append(inputs[-1] + 1)
        script = [p for p in w.model_calls if start < p < end]
        if not script or script[-1] >= len(msgs) or msgs[script[-1]].get("tool_calls"):
            script.append(len(msgs) + 1 + n)
        yield inputs, script


class Facts:
    """Puts one unique marker into each tool output, on a line at a random place."""

    def __init__(self, gen: TranscriptGenerator) -> None:
        self.r = gen.r
        self.n = 0

    def mark(self, output: str) -> str:
        self.n += 1
        marker = f"fact_id=F{self.n:05d}-{self.r.getrandbits(24):06x}"
        lines = output.split("\n")
        lines.insert(self.r.randrange(len(lines) + 1), marker)
        return "\n".join(lines)


def _call_message(text: str | None, calls: Sequence[Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in calls
        ],
    }


def _tool_message(call_id: str, name: str, output: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": output}


def _openai(msgs: Iterable[Msg]) -> Iterator[dict[str, Any]]:
    from autoctx import to_openai_messages

    yield from to_openai_messages(list(msgs))


def _marked_step(gen: TranscriptGenerator, facts: Facts) -> list[dict[str, Any]]:
    step = list(_openai(gen.step()))
    for m in step[1:]:
        m["content"] = facts.mark(m["content"])
    return step


def toolchat(seed: int, turns: int) -> list[dict[str, Any]]:
    gen = TranscriptGenerator(seed)
    texts, calls, facts = Texts(gen), Calls(), Facts(gen)
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful agent."}]
    for _ in range(turns):
        user, responses = tool_turn(gen, texts, calls)
        out.append({"role": "user", "content": user})
        for response in responses:
            if isinstance(response, str):
                out.append({"role": "assistant", "content": response})
                continue
            out.append(_call_message(None, response))
            for call in response:
                text = texts.text(TOOL_OUTPUT_KINDS[call.name], gen.r.randint(200, 800))
                out.append(_tool_message(call.id, call.name, facts.mark(text)))
    return out


def longtask(seed: int, steps: int) -> list[dict[str, Any]]:
    gen = TranscriptGenerator(seed)
    texts, facts = Texts(gen), Facts(gen)
    out = [
        {"role": "system", "content": "You are a coding agent. " + texts.text("prose", 600)},
        {"role": "user", "content": gen.user().text},
    ]
    for _ in range(steps):
        out.extend(_marked_step(gen, facts))
    out.append({"role": "assistant", "content": gen.answer().text})
    return out


def bigtask(seed: int, steps: int) -> list[dict[str, Any]]:
    """One user request and `steps` tool steps whose outputs are all 500 to 8,000 characters
    (log-uniform): a 32,000-token window holds about 30 of them, so every rung that shortens
    one output at a time is called often."""
    gen = TranscriptGenerator(seed)
    texts, calls, facts, r = Texts(gen), Calls(), Facts(gen), gen.r
    lo, hi = BIG_OUTPUT_CHARS
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " + texts.text("prose", 600)},
        {"role": "user", "content": gen.user().text},
    ]
    for _ in range(steps):
        made = [calls.new(r) for _ in range(1 if r.random() < 0.7 else r.randrange(2, 4))]
        text = texts.text("prose", r.randint(5, 30)) if r.random() < 0.3 else None
        out.append(_call_message(text, made))
        for call in made:
            chars = round(math.exp(r.uniform(math.log(lo), math.log(hi))))
            output = gen.text(TOOL_OUTPUT_KINDS[call.name], chars)
            out.append(_tool_message(call.id, call.name, facts.mark(output)))
    out.append({"role": "assistant", "content": gen.answer().text})
    return out


def multitask(seed: int, tasks: int) -> list[dict[str, Any]]:
    gen = TranscriptGenerator(seed)
    texts, facts = Texts(gen), Facts(gen)
    out = [{"role": "system", "content": "You are a coding agent. " + texts.text("prose", 800)}]
    for _ in range(tasks):
        out.append({"role": "user", "content": gen.user().text})
        # Log-uniform lengths, as agent benchmarks' trajectories spread.
        for _ in range(round(math.exp(gen.r.uniform(math.log(10), math.log(120))))):
            out.extend(_marked_step(gen, facts))
        out.append({"role": "assistant", "content": gen.answer().text})
    return out


def chat(seed: int, rounds: int) -> list[dict[str, Any]]:
    gen = TranscriptGenerator(seed)
    texts, r, calls, facts = Texts(gen), gen.r, Calls(), Facts(gen)
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    for _ in range(rounds):
        out.append({"role": "user", "content": texts.text("prose", r.randint(50, 300))})
        if r.random() < 0.25:
            call = calls.new(r)
            out.append(_call_message(None, [call]))
            text = texts.text(TOOL_OUTPUT_KINDS[call.name], r.randint(100, 600))
            out.append(_tool_message(call.id, call.name, facts.mark(text)))
        out.append({"role": "assistant", "content": texts.text("prose", r.randint(200, 1500))})
    return out


def coding_agent(seed: int, steps: int) -> list[dict[str, Any]]:
    """A coding agent's session (shaped like SWE-agent and OpenHands runs): one task and, a
    third of the way in, a user follow-up; `steps` tool steps, most of them short shell results
    (100 to 2,000 characters: ls, git, a failing assertion), a few huge ones (50 to 150 KB: a
    file dumped whole, a full test log); W = 128,000, a coding agent's window."""
    gen = TranscriptGenerator(seed)
    texts, calls, facts, r = Texts(gen), Calls(), Facts(gen), gen.r
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " + texts.text("prose", 900)},
        {"role": "user", "content": gen.user().text},
    ]
    follow_up = steps // 3
    for k in range(steps):
        if k == follow_up:
            out.append({"role": "assistant", "content": gen.answer().text})
            out.append({"role": "user", "content": gen.user().text})
        made = [calls.new(r) for _ in range(1 if r.random() < 0.85 else 2)]
        text = texts.text("prose", r.randint(5, 40)) if r.random() < 0.4 else None
        out.append(_call_message(text, made))
        for call in made:
            if r.random() < HUGE_SHARE:
                lo, hi = HUGE_OUTPUT_CHARS
                kind = r.choice(("code", "log"))
            else:
                lo, hi = SHELL_OUTPUT_CHARS
                kind = TOOL_OUTPUT_KINDS[call.name]
            chars = round(math.exp(r.uniform(math.log(lo), math.log(hi))))
            out.append(_tool_message(call.id, call.name, facts.mark(gen.text(kind, chars))))
    out.append({"role": "assistant", "content": gen.answer().text})
    return out


#: The constraints a support agent's user sets and restates (as tau-bench's users do).
_CONSTRAINTS = (
    "Do not cancel the order, only change it.",
    "The delivery address must stay the same.",
    "Never charge the card ending in 4242 again.",
    "Refund to the original payment method only.",
    "I must have it before Friday.",
    "Do not upgrade my plan.",
)


def support_agent(seed: int, turns: int) -> list[dict[str, Any]]:
    """A customer-support agent's session (shaped like tau-bench runs): `turns` user turns, each
    answered after 0 to 3 tool calls returning small JSON records (200 to 1,500 characters);
    the user sets constraints early and restates them now and then; W = 16,000."""
    gen = TranscriptGenerator(seed)
    texts, calls, facts, r = Texts(gen), Calls(), Facts(gen), gen.r
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a support agent. " + texts.text("prose", 700)}
    ]
    constraints = r.sample(_CONSTRAINTS, 3)
    for k in range(turns):
        said = texts.text("prose", r.randint(15, 80))
        if k == 0 or r.random() < 0.2:
            said = " ".join(constraints) + " " + said
        out.append({"role": "user", "content": said})
        for _ in range(r.choice((0, 1, 1, 2, 2, 3))):
            calls.n += 1
            call = ToolUseBlock(f"call_{calls.n}", "http_get", tool_arguments(r, "http_get"))
            out.append(_call_message(None, [call]))
            lo, hi = JSON_OUTPUT_CHARS
            chars = round(math.exp(r.uniform(math.log(lo), math.log(hi))))
            out.append(_tool_message(call.id, call.name, facts.mark(gen.text("json", chars))))
        out.append({"role": "assistant", "content": texts.text("prose", r.randint(40, 250))})
    return out


def from_trajectories(directory: Path) -> list[dict[str, Any]]:
    """The trajectories as one session: the first system message leads, later ones are kept
    as user notes (none of the three systems takes a system message mid-session the same
    way), and a tool output without a marker gets one."""
    gen = TranscriptGenerator(0)
    facts = Facts(gen)
    # from_openai_messages validates the shape (calls answered, ids) and normalizes content.
    msgs = list(_openai(from_openai_messages(list(trajectories(directory)))))
    out: list[dict[str, Any]] = []
    for m in msgs:
        if m["role"] in ("system", "developer") and out:
            m = {"role": "user", "content": f"[system note] {m.get('content') or ''}"}
        if not isinstance(m.get("content"), str | None):
            m["content"] = "\n".join(str(p.get("text", "")) for p in m["content"])
        if m["role"] == "tool" and not FACT_RE.search(m["content"] or ""):
            m["content"] = facts.mark(m["content"] or "")
        out.append(m)
    return out


def build(args: argparse.Namespace, name: str) -> Workload:
    sizes = QUICK if args.quick else SIZES
    if name == "trajectories":
        return Workload(name, args.window, from_trajectories(args.trajectories))
    makers = {
        "toolchat": toolchat,
        "longtask": longtask,
        "bigtask": bigtask,
        "multitask": multitask,
        "chat": chat,
        "coding-agent": coding_agent,
        "support-agent": support_agent,
    }
    return Workload(name, WINDOWS[name], makers[name](args.seed, sizes[name]))


# ---------------------------------------------------------------------------------------------
# Counting: one tokenizer and one rule for every system
# ---------------------------------------------------------------------------------------------


class Tokens:
    def __init__(self) -> None:
        self.counter = TokenCounter("gpt-4o")

    def message(self, m: dict[str, Any]) -> int:
        text = m.get("content")
        if not isinstance(text, str):
            text = "\n".join(str(p.get("text", "")) for p in text or [] if isinstance(p, dict))
        total = int(self.counter.count(text)) + PER_MESSAGE_TOKENS
        for call in m.get("tool_calls") or []:
            fn = call["function"]
            total += int(self.counter.count(fn["name"])) + int(self.counter.count(fn["arguments"]))
        return total

    def text(self, text: str) -> int:
        return int(self.counter.count(text)) + PER_MESSAGE_TOKENS


@dataclass
class Run:
    """One system on one workload: the input of each model call, as message keys."""

    system: str
    steps: list[list[int | str]] = field(default_factory=list)
    #: Texts of the messages the system made (summaries), by key.
    made: dict[str, str] = field(default_factory=dict)
    summarizer_calls: int = 0
    summarizer_in: int = 0
    summarizer_out: int = 0
    seconds: float = 0.0
    reachable_facts: int | None = None
    #: autoctx only: the fact check's repair calls and their tokens (in, out), and whether the
    #: summarizer was counted here (not by the summary server).
    check: tuple[int, int, int] | None = None
    own_usage: bool = False
    #: The masking peers: the tool outputs their model ever saw as a placeholder.
    cleared: set[str] = field(default_factory=set)
    note: str = ""
    #: autoctx only: per strategy, [applied, failed, summarizer calls, tokens in, tokens out]
    #: from its compression events (one row per attempt).
    by_strategy: dict[int, list[int]] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# autoctx
# ---------------------------------------------------------------------------------------------


def run_autoctx(
    db: BenchDatabase,
    server: SummaryServer,
    w: Workload,
    fields: dict[str, Any] | None = None,
    system: str = "autoctx",
) -> Run:
    kind = AUTOCTX_RUNS[system]
    inner: Any
    if kind == "shared":
        note = "OpenAISummarizer -> the summary server"
        inner = OpenAISummarizer(model=system, base_url=server.base_url, api_key="bench")
    elif kind == "offline":
        note = "OfflineSummarizer, in process (no repair: the index line alone)"
        inner = OfflineSummarizer()
    else:
        note = "a lossy stub that drops every fact (repair asked, index line)"
        inner = LossySummarizer()
    if fields:
        note += f", config {json.dumps(fields, sort_keys=True)}"
    run = Run(system, note=note, own_usage=kind != "shared")
    summarizer = CheckTally(inner)
    mem = AutoContextMemory.open(
        f"agent-cost-{w.name}-{system}",
        database_url=db.url,
        config=AutoContextConfig(max_tokens=w.window, **(fields or {})),
        summarizer=summarizer,
    )
    index_of: dict[int, int] = {}
    points = set(w.model_calls)
    started = time.perf_counter()
    try:
        pending: list[dict[str, Any]] = []
        originals: list[int] = []

        def flush() -> None:
            # One add() per model response and its results: the shape rules want a call's
            # results right after it.
            if pending:
                for k, stored in zip(
                    originals, mem.add(from_openai_messages(pending)), strict=True
                ):
                    if stored.id is not None:
                        index_of[stored.id] = k
                pending.clear()
                originals.clear()

        def model_call() -> None:
            flush()
            mem.compress_if_needed()
            keys: list[int | str] = []
            for m in mem.messages():
                if m.id in index_of:
                    keys.append(index_of[m.id])
                else:
                    key = f"a:{m.id}"
                    run.made[key] = _seen_text(m)
                    keys.append(key)
            run.steps.append(keys)

        for i, m in enumerate(w.messages):
            if i in points:
                model_call()
            if m["role"] != "tool":
                flush()
            pending.append(m)
            originals.append(i)
        flush()
        if len(w.messages) in points:
            model_call()
        run.seconds = time.perf_counter() - started
        run.reachable_facts = len(_reachable(mem, run))
        run.by_strategy = _by_strategy(mem)
        run.check = (summarizer.repairs, summarizer.repair_in, summarizer.repair_out)
        if kind != "shared":
            events = [e for e in mem.events() if e.prompt_tokens is not None]
            run.summarizer_calls = sum(
                1 for e in events if e.model is not None and e.model != "offline"
            ) + sum(e.facts.repair_calls for e in mem.events() if e.facts is not None)
            run.summarizer_in = sum(e.prompt_tokens or 0 for e in events)
            run.summarizer_out = sum(e.completion_tokens or 0 for e in events)
    finally:
        mem.close()
        close = getattr(inner, "close", None)
        if close is not None:
            close()
    return run


def _by_strategy(mem: AutoContextMemory) -> dict[int, list[int]]:
    """Per strategy: applied and failed events, summarizer calls, and their tokens in and out
    as the summary server reported them (an event with a model is one summarizer call)."""
    out: dict[int, list[int]] = {}
    for e in mem.events():
        row = out.setdefault(e.strategy, [0, 0, 0, 0, 0])
        row[0] += e.status == "applied"
        row[1] += e.status == "failed"
        if e.model is not None and e.prompt_tokens is not None:
            row[2] += 1
            row[3] += e.prompt_tokens
            row[4] += e.completion_tokens or 0
    return dict(sorted(out.items()))


def _reachable(mem: AutoContextMemory, run: Run) -> set[str]:
    """Fact markers in the final context and in every offload reachable from it."""
    found: set[str] = set()
    seen: set[str] = set()
    texts = [_msg_text(m) for m in mem.messages()]
    while texts:
        text = texts.pop()
        found.update(FACT_RE.findall(text))
        # The offloads the tags name (a handle, or a uuid in a tag written before handles),
        # and any other uuid (a search hit's offload quoted in a tool answer).
        for ref in {*tag_ids(text), *UUID_RE.findall(text)}:
            if ref in seen:
                continue
            seen.add(ref)
            with contextlib.suppress(Exception):  # a uuid in a tool output is not an offload
                texts.extend(_msg_text(m) for m in mem.reload(int(ref) if ref.isdigit() else ref))
    return found


def _seen_text(m: Msg) -> str:
    """What the model reads of a message autoctx made (a summary, a preview, a masked tool
    output), as `Tokens.message` counts an original: its text or tool output, and its tool
    calls' names and arguments. (`Msg.text` alone leaves a tool output out: a masked output
    would count as an empty message.)"""
    from autoctx import to_openai_messages

    parts: list[str] = []
    for d in to_openai_messages([m]):
        content = d.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
        for call in d.get("tool_calls") or []:
            parts += [call["function"]["name"], call["function"]["arguments"]]
    return "\n".join(p for p in parts if p)


def _msg_text(m: Msg) -> str:
    from autoctx import to_openai_messages

    return json.dumps(to_openai_messages([m]))


# ---------------------------------------------------------------------------------------------
# LangChain
# ---------------------------------------------------------------------------------------------


def run_langchain(server: SummaryServer, w: Workload, tokens: Tokens, *, mask: bool = False) -> Run:
    """LangChain's agent with `SummarizationMiddleware`; with `mask`, `ContextEditingMiddleware`
    (`ClearToolUsesEdit`) in front of it and the summarization as its fallback."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import (
        ClearToolUsesEdit,
        ContextEditingMiddleware,
        SummarizationMiddleware,
    )
    from langchain_core.callbacks import CallbackManagerForLLMRun
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import InjectedToolCallId, StructuredTool
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.memory import InMemorySaver

    system = "langchain-mask" if mask else "langchain"
    run = Run(system, note="ChatOpenAI -> the summary server")
    msgs = w.messages
    call_index: dict[str, int] = {}
    outputs: dict[str, str] = {}
    for i, m in enumerate(msgs):
        if m["role"] == "tool":
            call_index[m["tool_call_id"]] = i
            outputs[m["tool_call_id"]] = m["content"]
    script: list[int] = []  # indices of the assistant messages still to play

    def key_of(message: BaseMessage) -> int | str:
        if isinstance(message, SystemMessage):
            return 0
        if isinstance(message, ToolMessage):
            if message.content == outputs[message.tool_call_id]:
                return call_index[message.tool_call_id]
            # Cleared by the edit: its placeholder stands where the output was.
            run.cleared.add(message.tool_call_id)
            digest = hashlib.sha1(str(message.content).encode()).hexdigest()[:8]
            key = f"l:{message.tool_call_id}:{digest}"
            run.made[key] = str(message.content)
            return key
        ident = message.id or ""
        # (An answer past the end is the stub that stops a turn cut short: a made message.)
        if ident.startswith("m") and ident[1:].isdigit() and int(ident[1:]) < len(msgs):
            return int(ident[1:])
        key = f"l:{hashlib.sha1(str(message.content).encode()).hexdigest()[:12]}"
        run.made[key] = str(message.content)
        return key

    class ScriptedModel(BaseChatModel):
        """Plays the workload's responses, and reports the usage a provider would."""

        @property
        def _llm_type(self) -> str:
            return "bench-scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(
            self,
            messages: list[BaseMessage],
            stop: list[str] | None = None,
            run_manager: CallbackManagerForLLMRun | None = None,
            **kwargs: Any,
        ) -> ChatResult:
            keys = [key_of(m) for m in messages]
            used = sum(_key_tokens(k, msgs, run.made, tokens) for k in keys)
            i = script.pop(0)
            if i <= len(msgs):  # not a turn's stub answer
                run.steps.append(keys)
            m: dict[str, Any] = (
                msgs[i] if i < len(msgs) else {"role": "assistant", "content": "(stopped)"}
            )
            calls = [
                {
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "args": json.loads(c["function"]["arguments"] or "{}"),
                    "type": "tool_call",
                }
                for c in m.get("tool_calls") or []
            ]
            out = tokens.message(m)
            reply = AIMessage(
                content=m.get("content") or "",
                tool_calls=calls,
                id=f"m{i}",
                usage_metadata={
                    "input_tokens": used,
                    "output_tokens": out,
                    "total_tokens": used + out,
                },
                response_metadata={"model_provider": "openai"},
            )
            return ChatResult(generations=[ChatGeneration(message=reply)])

    def invoke(
        tool_call_id: Annotated[str, InjectedToolCallId],
        path: str | None = None,
        cmd: str | None = None,
        pattern: str | None = None,
        url: str | None = None,
        code: str | None = None,
        content: str | None = None,
    ) -> str:
        return outputs[tool_call_id]

    # This module's annotations are strings (postponed evaluation), which LangChain resolves in
    # the module's globals, where the lazily imported names are not: give it the objects.
    optional = str | None
    invoke.__annotations__ = {
        "tool_call_id": Annotated[str, InjectedToolCallId],
        **dict.fromkeys(("path", "cmd", "pattern", "url", "code", "content"), optional),
        "return": str,
    }

    names = sorted(
        {c["function"]["name"] for m in msgs for c in m.get("tool_calls") or []}
        | set(TOOL_OUTPUT_KINDS)
    )
    tools = [
        StructuredTool.from_function(invoke, name=n, description=f"the {n} tool") for n in names
    ]
    summary_model = ChatOpenAI(
        model=system,
        base_url=server.base_url,
        api_key="bench",  # type: ignore[arg-type]
        max_retries=0,
        profile={"max_input_tokens": w.window},
    )
    middleware: list[Any] = [SummarizationMiddleware(summary_model, trigger=("fraction", TRIGGER))]
    if mask:
        # Anthropic's clear_tool_uses defaults (keep the last 3 results), its trigger at the
        # same 0.75 W as every system here.
        edit = ClearToolUsesEdit(trigger=int(TRIGGER * w.window), keep=3)
        counted: dict[str, int] = {}

        def exact_tokens(messages: Sequence[BaseMessage]) -> int:
            # Both middlewares count with the bench's tokenizer: the default approximate
            # counter reads code and JSON low (4 characters a token), and only the
            # summarization's copy of it is scaled by the reported usage, so the edit would
            # fire later than the summary it is meant to spare.
            total = 0
            for m in messages:
                texts = [m.content if isinstance(m.content, str) else str(m.content)]
                for call in getattr(m, "tool_calls", None) or []:
                    texts += [call["name"], json.dumps(call["args"])]
                for text in texts:
                    if text not in counted:
                        counted[text] = int(tokens.counter.count(text))
                    total += counted[text]
                total += PER_MESSAGE_TOKENS
            return total

        def masked_tokens(messages: Sequence[BaseMessage]) -> int:
            # SummarizationMiddleware is a before_model hook: it reads the agent's state, which
            # the edit (a wrap_model_call hook, on the request only) never changes, so counted
            # as it is it fires whenever the unmasked history passes its trigger and the edit
            # never spares a call. Counting the history as the edit leaves it makes the summary
            # the fallback: it runs when the masked request is still over its trigger.
            edited = list(messages)
            edit.apply(edited, count_tokens=exact_tokens)
            return exact_tokens(edited)

        middleware = [
            SummarizationMiddleware(
                summary_model, trigger=("fraction", TRIGGER), token_counter=masked_tokens
            ),
            ContextEditingMiddleware(edits=[edit], token_counter=exact_tokens),
        ]
    agent = create_agent(
        ScriptedModel(),
        tools=tools,
        system_prompt=msgs[0]["content"] if msgs[0]["role"] == "system" else None,
        middleware=middleware,
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "bench"}, "recursion_limit": 10_000}
    started = time.perf_counter()
    for inputs, calls in turns(w):
        script[:] = calls
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            agent.invoke(
                {"messages": [HumanMessage(msgs[i]["content"], id=f"m{i}") for i in inputs]},
                config,
            )
    run.seconds = time.perf_counter() - started
    return run


# ---------------------------------------------------------------------------------------------
# pydantic-ai-harness TieredCompaction
# ---------------------------------------------------------------------------------------------


def run_tiered(server: SummaryServer, w: Workload, tokens: Tokens) -> Run:
    """A pydantic-ai `Agent` with the harness's `TieredCompaction` over its documented tiers:
    `ClearToolResults(keep_pairs=3)` then `SummarizingCompaction(keep_messages=20)`, with its
    target at the same 0.75 W; the agent's model and the summarizer are `FunctionModel`s, the
    first replaying the workload, the second asking the shared summary server."""
    import httpx
    from pydantic_ai import Agent, RunContext
    from pydantic_ai.messages import (
        CompactionPart,
        ModelMessage,
        ModelRequest,
        ModelResponse,
        SystemPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.tools import Tool
    from pydantic_ai.usage import RequestUsage, UsageLimits
    from pydantic_ai_harness.compaction import (
        ClearToolResults,
        SummarizingCompaction,
        TieredCompaction,
    )

    run = Run("tiered", note="FunctionModel -> the summary server")
    msgs = w.messages
    call_index: dict[str, int] = {}
    outputs: dict[str, str] = {}
    for i, m in enumerate(msgs):
        if m["role"] == "tool":
            call_index[m["tool_call_id"]] = i
            outputs[m["tool_call_id"]] = m["content"]
    user_index = {m["content"]: i for i, m in enumerate(msgs) if m["role"] == "user"}
    script: list[int] = []

    def made(prefix: str, text: str) -> str:
        key = f"{prefix}:{hashlib.sha1(text.encode()).hexdigest()[:12]}"
        run.made[key] = text
        return key

    def keys_of(messages: Sequence[ModelMessage]) -> list[int | str]:
        keys: list[int | str] = []
        for message in messages:
            if isinstance(message, ModelResponse):
                ident = message.provider_response_id or ""
                if ident.startswith("m") and ident[1:].isdigit():
                    keys.append(int(ident[1:]))
                else:
                    keys.append(made("t", "\n".join(str(p) for p in message.parts)))
                continue
            for part in message.parts:
                if isinstance(part, SystemPromptPart) and part.content == msgs[0]["content"]:
                    keys.append(0)
                elif isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    index = user_index.get(part.content)
                    keys.append(index if index is not None else made("t", part.content))
                elif isinstance(part, ToolReturnPart):
                    if part.content == outputs.get(part.tool_call_id):
                        keys.append(call_index[part.tool_call_id])
                    else:  # cleared: the placeholder stands where the output was
                        run.cleared.add(part.tool_call_id)
                        keys.append(made(f"t:{part.tool_call_id}", str(part.content)))
                elif isinstance(part, CompactionPart):
                    keys.append(made("t", part.content or ""))
                else:
                    keys.append(made("t", str(getattr(part, "content", part))))
        return keys

    def agent_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        keys = keys_of(messages)
        used = sum(_key_tokens(k, msgs, run.made, tokens) for k in keys)
        i = script.pop(0)
        if i <= len(msgs):  # not a turn's stub answer
            run.steps.append(keys)
        m = msgs[i] if i < len(msgs) else {"role": "assistant", "content": "(stopped)"}
        parts: list[Any] = [TextPart(m["content"])] if m.get("content") else []
        parts += [
            ToolCallPart(c["function"]["name"], c["function"]["arguments"], tool_call_id=c["id"])
            for c in m.get("tool_calls") or []
        ]
        return ModelResponse(
            parts=parts,
            # What a provider reports: the harness anchors its token estimate on it.
            usage=RequestUsage(input_tokens=used, output_tokens=tokens.message(m)),
            model_name="bench-scripted",
            provider_response_id=f"m{i}" if i < len(msgs) else None,
        )

    http = httpx.Client(timeout=120)

    def summarizer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        # The summary agent's request as the OpenAI protocol carries it: its instructions as
        # the system message, its prompt (the template around the transcript) as the user's.
        body = [{"role": "system", "content": info.instructions or ""}] + [
            {"role": "user", "content": part.content}
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, UserPromptPart) and isinstance(part.content, str)
        ]
        answer = http.post(
            f"{server.base_url}/chat/completions", json={"model": "tiered", "messages": body}
        )
        answer.raise_for_status()
        data = answer.json()
        return ModelResponse(
            parts=[TextPart(data["choices"][0]["message"]["content"])],
            usage=RequestUsage(
                input_tokens=data["usage"]["prompt_tokens"],
                output_tokens=data["usage"]["completion_tokens"],
            ),
            model_name="tiered",
        )

    def invoke(ctx: RunContext[None], **arguments: Any) -> str:
        return outputs[ctx.tool_call_id or ""]

    names = sorted(
        {c["function"]["name"] for m in msgs for c in m.get("tool_calls") or []}
        | set(TOOL_OUTPUT_KINDS)
    )
    schema = {"type": "object", "properties": {}, "additionalProperties": True}
    tools = [
        Tool.from_schema(
            invoke, name=n, description=f"the {n} tool", json_schema=schema, takes_ctx=True
        )
        for n in names
    ]
    # The tiers as the harness documents them ("Cost: why summarization is the last resort"):
    # each tier's own trigger is bypassed inside TieredCompaction, which stops at its target.
    tiered = TieredCompaction(
        tiers=[
            ClearToolResults(max_tokens=1, keep_pairs=3),
            SummarizingCompaction(
                FunctionModel(summarizer, model_name="tiered"), max_messages=1, keep_messages=20
            ),
        ],
        target_tokens=int(TRIGGER * w.window),
    )
    agent = Agent(
        FunctionModel(agent_model, model_name="bench-scripted"),
        system_prompt=msgs[0]["content"] if msgs[0]["role"] == "system" else (),
        tools=tools,
        capabilities=[tiered],
    )
    history: list[ModelMessage] = []
    started = time.perf_counter()
    try:
        for inputs, calls in turns(w):
            script[:] = calls
            # Consecutive user messages: the earlier ones as a request of the history.
            if len(inputs) > 1:
                parts = [UserPromptPart(msgs[i]["content"]) for i in inputs[:-1]]
                history = [*history, ModelRequest(parts=parts)]
            result = agent.run_sync(
                msgs[inputs[-1]]["content"],
                message_history=history,
                usage_limits=UsageLimits(request_limit=None),  # a task of hundreds of steps
            )
            # The compactions persist into the run's history, which the next turn continues.
            history = result.all_messages()
    finally:
        http.close()
    run.seconds = time.perf_counter() - started
    return run


# ---------------------------------------------------------------------------------------------
# OpenHands (a child process)
# ---------------------------------------------------------------------------------------------


def run_openhands(python: str, server: SummaryServer, w: Workload) -> Run:
    run = Run("openhands", note="litellm -> the summary server")
    driver = Path(__file__).with_name("_openhands_driver.py")
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp, "workload.json"), Path(tmp, "out.json")
        src.write_text(json.dumps({"messages": w.messages, "model_calls": w.model_calls}))
        started = time.perf_counter()
        proc = subprocess.run(
            [python, str(driver), str(src), str(out), server.base_url, str(w.window)],
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            raise SystemExit(f"openhands driver failed:\n{proc.stderr[-4000:]}")
        result = json.loads(out.read_text())
        run.seconds = time.perf_counter() - started - result["import_seconds"]
    run.steps = result["steps"]
    run.made = result["summaries"]
    run.note = f"litellm -> the summary server, Python {result['python']} child process"
    return run


def openhands_python(args: argparse.Namespace) -> tuple[str | None, str]:
    """The interpreter to run OpenHands with, or None and why not."""
    python = args.openhands_python
    if not python:
        return None, "no --openhands-python (a Python 3.12+ with openhands-sdk) given"
    probe = subprocess.run(
        [python, "-c", "import openhands.sdk, sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
    )
    if probe.returncode:
        return None, f"openhands-sdk is not importable by {python}"
    return python, ""


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------


def _key_tokens(
    key: int | str, msgs: list[dict[str, Any]], made: dict[str, str], tokens: Tokens
) -> int:
    if isinstance(key, int):
        return tokens.message(msgs[key])
    return tokens.text(made[key])


def saturated_from(w: Workload, tokens: Tokens) -> int:
    """The first model call (its index among them) whose uncompressed input, the whole
    workload before it, is over the trigger: from there on every system has to compress, and
    its summarizer calls are counted against these calls alone."""
    total = 0
    done = 0
    for n, point in enumerate(w.model_calls):
        while done < point:
            total += tokens.message(w.messages[done])
            done += 1
        if total > TRIGGER * w.window:
            return n
    return len(w.model_calls)


def figures(
    w: Workload, run: Run, server: SummaryServer, tokens: Tokens, saturated: int
) -> dict[str, Any]:
    cache: dict[int | str, int] = {}

    def count(key: int | str) -> int:
        if key not in cache:
            cache[key] = _key_tokens(key, w.messages, run.made, tokens)
        return cache[key]

    inputs: list[int] = []
    billed = 0.0
    cached = 0
    # Tokens the previous call had sent too but this one pays in full: the messages after the
    # first one a compression changed (what an edit costs the cache, besides the new messages).
    rebilled = 0
    previous: list[int | str] = []
    for keys in run.steps:
        total = sum(count(k) for k in keys)
        prefix = 0
        for a, b in zip(previous, keys, strict=False):
            if a != b:
                break
            prefix += count(a)
        billed += CACHED_PRICE * prefix + (total - prefix)
        cached += prefix
        seen = set(previous)
        rebilled += total - prefix - sum(count(k) for k in keys if k not in seen)
        inputs.append(total)
        previous = keys
    usage = server.usage.get(run.system)  # each system names its model after itself
    calls = usage.calls if usage else 0
    s_in = usage.prompt_tokens if usage else 0
    s_out = usage.completion_tokens if usage else 0
    if run.own_usage:  # an autoctx run whose summarizer ran in process
        calls, s_in, s_out = run.summarizer_calls, run.summarizer_in, run.summarizer_out
    final = run.steps[-1] if run.steps else []
    final_text = "\n".join(
        json.dumps(w.messages[k]) if isinstance(k, int) else run.made[k] for k in final
    )
    all_facts = {
        f for m in w.messages if m["role"] == "tool" for f in FACT_RE.findall(m["content"] or "")
    }
    visible = _visible(w, run)
    index_sent = check_cost(run.steps, run.made, tokens.counter)
    repairs, repair_in, repair_out = run.check or (0, 0, 0)
    return {
        "system": run.system,
        "note": run.note,
        "visible_calls": visible.calls,
        "visible_mean": visible.mean,
        "visible_after_compression_min": visible.after_compression_min,
        "visible_after_compression_mean": visible.after_compression_mean,
        "compressions": visible.compressions,
        "check_repair_calls": repairs,
        "check_repair_tokens_in": repair_in,
        "check_repair_tokens_out": repair_out,
        "check_index_tokens_sent": index_sent,
        "check_cost": round(repair_in + OUTPUT_PRICE * repair_out + index_sent),
        "model_calls": len(run.steps),
        "peak_tokens": max(inputs, default=0),
        "peak_over_window": max(inputs, default=0) / w.window,
        "calls_over_window": sum(1 for x in inputs if x > w.window),
        "summarizer_calls": calls,
        "summarizer_tokens_in": s_in,
        "summarizer_tokens_out": s_out,
        "agent_input_tokens": sum(inputs),
        "agent_input_billed": round(billed),
        "cached_share": cached / max(1, sum(inputs)),
        "rebilled_tokens": rebilled,
        "total_cost": round(billed + s_in + OUTPUT_PRICE * s_out),
        "facts": len(all_facts),
        "facts_verbatim": len(set(FACT_RE.findall(final_text)) & all_facts),
        "facts_reachable": run.reachable_facts,
        "outputs_cleared": len(run.cleared),
        "seconds": run.seconds,
        "by_strategy": {str(k): v for k, v in run.by_strategy.items()},
        "saturated_calls": max(0, len(run.steps) - saturated),
        "summarizer_calls_per_10_saturated": (
            10 * calls / (len(run.steps) - saturated) if len(run.steps) > saturated else None
        ),
        # Filled in by compare() once every system has run the workload.
        "cost_vs_cheapest_bounded_peer": None,
        "inputs": inputs,
    }


def _visible(w: Workload, run: Run) -> Visible:
    """The planted facts (the tool outputs' fact markers) each model call shows verbatim."""
    points = w.model_calls
    made_facts: dict[int | str, frozenset[str]] = {}

    def facts_of_key(key: Any) -> frozenset[str]:
        if key not in made_facts:
            text = json.dumps(w.messages[key]) if isinstance(key, int) else run.made[key]
            made_facts[key] = facts_in(text, FACT_RE)
        return made_facts[key]

    planted: list[frozenset[str]] = [frozenset()]
    for m in w.messages:
        found = FACT_RE.findall(m["content"] or "") if m["role"] == "tool" else []
        planted.append(planted[-1] | frozenset(found))
    return visible_shares(run.steps, points, facts_of_key, planted.__getitem__, lambda n: n)


def compare(res: dict[str, Any]) -> None:
    """Each system's total cost over the cheapest peer that stays under the window (a peer
    with a model call over W is shown but is never the cheapest), and the workload's
    cheapest bounded peer and fewest summarizer calls of a bounded peer."""
    bounded = [
        f for f in res["systems"] if f["system"] not in AUTOCTX_RUNS and not f["calls_over_window"]
    ]
    if not bounded:
        res["cheapest_bounded_peer"] = res["fewest_calls_bounded_peer"] = None
        return
    cheapest = min(bounded, key=lambda f: f["total_cost"])
    fewest = min(bounded, key=lambda f: f["summarizer_calls"])
    res["cheapest_bounded_peer"] = cheapest["system"]
    res["fewest_calls_bounded_peer"] = fewest["system"]
    for f in res["systems"]:
        f["cost_vs_cheapest_bounded_peer"] = f["total_cost"] / max(1, cheapest["total_cost"])
    # Peer figures of an earlier run (--peers-from) may predate the visible-facts measure.
    best = max(bounded, key=lambda f: f.get("visible_mean") or 0.0)
    res["most_visible_bounded_peer"] = best["system"]
    for f in res["systems"]:
        base = best.get("visible_mean")
        mine = f.get("visible_mean")
        f["visible_vs_best_bounded_peer"] = None if mine is None or not base else mine / base


def print_goals(results: dict[str, dict[str, Any]]) -> None:
    """autoctx against the bounded peers, per workload (issue 21's goals)."""
    table = Table(title="autoctx against the bounded peers")
    headers = (
        "workload", "autoctx total / cheapest bounded peer",
        "summarizer calls, autoctx vs the fewest of a bounded peer",
        "autoctx summarizer calls per 10 saturated calls", "autoctx calls > W",
        "autoctx facts reachable",
    )  # fmt: skip
    for header in headers:
        table.add_column(header, justify="left" if header == "workload" else "right")
    for name, res in results.items():
        by = {f["system"]: f for f in res["systems"]}
        a = by.get("autoctx")
        if a is None or res.get("cheapest_bounded_peer") is None:
            continue
        cheapest, fewest = by[res["cheapest_bounded_peer"]], by[res["fewest_calls_bounded_peer"]]
        per10 = a["summarizer_calls_per_10_saturated"]
        table.add_row(
            f"{name}, W={res['window']:,}",
            f"{a['cost_vs_cheapest_bounded_peer']:.2f}x ({cheapest['system']})",
            f"{a['summarizer_calls']} vs {fewest['summarizer_calls']} ({fewest['system']})",
            "-" if per10 is None else f"{per10:.2f}",
            f"{a['calls_over_window']:,}",
            f"{a['facts_reachable']:,} of {a['facts']:,}",
        )
    console.print(table)


def print_visible(results: dict[str, dict[str, Any]]) -> None:
    """The planted facts each system's model sees verbatim, and what autoctx's check costs
    (docs/design.md §6)."""
    table = Table(
        title="planted facts visible verbatim at each model call after the first compression"
    )
    headers = (
        "workload", "system", "calls", "compressions", "mean share",
        "vs best bounded peer", "right after a compression: lowest / mean",
    )  # fmt: skip
    for header in headers:
        table.add_column(header, justify="left" if header in ("workload", "system") else "right")
    for name, res in results.items():
        rows = res["systems"]
        for n, f in enumerate(rows):
            if "visible_mean" not in f:
                continue  # figures of an earlier run (--peers-from), before this measure
            ratio = f.get("visible_vs_best_bounded_peer")
            best = f["system"] == res.get("most_visible_bounded_peer")
            table.add_row(
                f"{name}, W={res['window']:,}" if n == 0 else "",
                f["system"] + (" (over W)" if f["calls_over_window"] else ""),
                f"{f['visible_calls']:,}",
                f"{f['compressions']:,}",
                _share(f["visible_mean"]),
                "-" if ratio is None else f"{ratio:.2f}x" + (" (best)" if best else ""),
                f"{_share(f['visible_after_compression_min'])} / "
                f"{_share(f['visible_after_compression_mean'])}",
                end_section=n == len(rows) - 1,
            )
    console.print(table)
    for name, res in results.items():
        for f in res["systems"]:
            if f["system"] not in AUTOCTX_RUNS or "check_cost" not in f:
                continue
            console.print(
                f"{name} / {f['system']} fact check cost: {f['check_repair_calls']:,} repair "
                f"calls, {f['check_repair_tokens_in']:,} in / {f['check_repair_tokens_out']:,} "
                f"out; index lines {f['check_index_tokens_sent']:,} tokens sent over all "
                f"calls; {f['check_cost']:,} input-token equivalents = "
                f"{f['check_cost'] / max(1, f['total_cost']):.1%} of its total cost",
                highlight=False,
            )


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_table(results: dict[str, dict[str, Any]], machine: str) -> None:
    table = Table(title=f"The agent's context and what it costs ({machine})")
    headers = (
        "workload", "W", "system", "calls", "peak (x W)", "calls > W", "summ. calls",
        "summ. in / out", "summ. / 10 sat.", "agent input", "cached", "re-billed", "billed (cache)",
        "total cost", "vs cheapest bounded peer", "facts verbatim", "reachable", "wall",
    )  # fmt: skip
    for header in headers:
        table.add_column(header, justify="left" if header in ("workload", "system") else "right")
    for name, res in results.items():
        rows = res["systems"]
        for n, f in enumerate(rows):
            table.add_row(
                name if n == 0 else "",
                f"{res['window']:,}" if n == 0 else "",
                f["system"],
                f"{f['model_calls']:,}",
                f"{f['peak_tokens']:,} ({f['peak_over_window']:.2f}x)",
                f"{f['calls_over_window']:,}",
                f"{f['summarizer_calls']:,}",
                f"{f['summarizer_tokens_in']:,} / {f['summarizer_tokens_out']:,}",
                _per10(f),
                f"{f['agent_input_tokens']:,}",
                f"{f['cached_share']:.0%}",
                "-" if f.get("rebilled_tokens") is None else f"{f['rebilled_tokens']:,}",
                f"{f['agent_input_billed']:,}",
                f"{f['total_cost']:,}",
                _versus(f, res),
                f"{f['facts_verbatim']:,} of {f['facts']:,}",
                "-" if f["facts_reachable"] is None else f"{f['facts_reachable']:,}",
                secs(f["seconds"]),
                end_section=n == len(rows) - 1,
            )
    console.print(table)
    for name, res in results.items():
        for f in res["systems"]:
            if not f.get("by_strategy"):
                continue
            parts = [
                f"S{k}: {a} applied, {fl} failed, {c} calls, {i:,} in / {o:,} out"
                for k, (a, fl, c, i, o) in f["by_strategy"].items()
            ]
            console.print(
                f"{name} / {f['system']} by strategy: " + "; ".join(parts), highlight=False
            )


def _per10(f: dict[str, Any]) -> str:
    per10 = f["summarizer_calls_per_10_saturated"]
    return "-" if per10 is None else f"{per10:.2f}"


def _versus(f: dict[str, Any], res: dict[str, Any]) -> str:
    if f["calls_over_window"]:
        return "over W"
    ratio = f["cost_vs_cheapest_bounded_peer"]
    if ratio is None:
        return "-"
    return f"{ratio:.2f}x" + (" (cheapest)" if f["system"] == res["cheapest_bounded_peer"] else "")


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(len(names), 1, figsize=(15, 3.4 * len(names)), squeeze=False)
    colors = {
        "autoctx": "tab:blue",
        "autoctx-offline": "tab:cyan",
        "autoctx-lossy": "tab:gray",
        "langchain": "tab:orange",
        "langchain-mask": "tab:red",
        "tiered": "tab:purple",
        "openhands": "tab:green",
    }
    for ax, name in zip(axes[:, 0], names, strict=True):
        res = results[name]
        for f in res["systems"]:
            if "inputs" not in f:  # a peer from --peers-from's file, which keeps no curve
                continue
            ax.plot(
                range(1, len(f["inputs"]) + 1),
                f["inputs"],
                lw=0.7,
                alpha=0.85,
                color=colors[f["system"]],
                label=f"{f['system']} (peak {f['peak_over_window']:.2f}x W, "
                f"{f['summarizer_calls']} summarizer calls)",
            )
        ax.axhline(res["window"], color="black", lw=0.9, label=f"window {res['window']:,}")
        ax.axhline(res["window"] * 0.75, color="black", ls="--", lw=0.7, label="0.75 W")
        ax.set_title(f"{name}: the model's input at each call")
        ax.set_xlabel("model call")
        ax.set_ylabel("input tokens")
        top = max((max(f.get("inputs", []), default=0) for f in res["systems"]), default=0)
        ax.set_ylim(0, max(top, res["window"]) * 1.08)
        # Beside the axes: inside, it hides the sawtooth it describes.
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def available(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, str]]:
    """The systems to run (with what drives them) and the skipped ones (with why)."""
    run: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for system in args.system_names:
        if system in AUTOCTX_RUNS:
            run[system] = ""
        elif system in ("langchain", "langchain-mask"):
            try:
                import langchain.agents.middleware  # noqa: F401
                import langchain_openai  # noqa: F401
            except ImportError as err:
                skipped[system] = f"not importable ({err}); pip install -e '.[peers]'"
            else:
                run[system] = ""
        elif system == "tiered":
            try:
                import pydantic_ai_harness.compaction  # noqa: F401
            except ImportError as err:
                skipped[system] = (
                    f"not importable ({err}); pip install -e '.[harness]' in a venv of its own "
                    "(bench/README.md, agent_cost.py)"
                )
            else:
                run[system] = ""
        else:
            python, why = openhands_python(args)
            if python is None:
                skipped[system] = why
            else:
                run[system] = python
    return run, skipped


def _earlier(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.peers_from is None:
        return None
    try:
        earlier: dict[str, Any] = json.loads(args.peers_from.read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"--peers-from {args.peers_from}: not readable as JSON ({err})") from err
    if earlier.get("seed") != args.seed or earlier.get("quick") != args.quick:
        raise SystemExit(
            f"--peers-from {args.peers_from}: made with seed {earlier.get('seed')} and quick "
            f"{earlier.get('quick')}, not {args.seed} and {args.quick}; run with the same ones"
        )
    return earlier


def _reused(
    args: argparse.Namespace,
    earlier: dict[str, Any] | None,
    name: str,
    res: dict[str, Any],
    running: dict[str, str],
) -> list[dict[str, Any]]:
    """The earlier run's figures of the systems not run now, on the same workload."""
    if earlier is None or name not in earlier.get("workloads", {}):
        return []
    old = earlier["workloads"][name]
    if old.get("digest") != res["digest"]:
        raise SystemExit(
            f"--peers-from {args.peers_from}: its {name} workload is not this one (another "
            "version of the bench or of --trajectories); run the peers again"
        )
    out = []
    for f in old["systems"]:
        if f["system"] not in AUTOCTX_RUNS and f["system"] not in running:
            out.append({**f, "note": f"{f['note']} (from {args.peers_from.name})"})
            console.print(f"  {name} / {f['system']}: from {args.peers_from}", highlight=False)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    systems, skipped = available(args)
    for system, why in skipped.items():
        console.print(f"[bold]skipped {system}[/bold]: {why}", highlight=False)
    tokens = Tokens()
    results: dict[str, dict[str, Any]] = {}
    earlier = _earlier(args)
    with fresh_database(args.database_url, "autoctx_bench_agent_cost") as db:
        machine = machine_description(db)
        for name in args.names:
            w = build(args, name)
            saturated = saturated_from(w, tokens)
            results[name] = {
                "window": w.window,
                "messages": len(w.messages),
                "model_calls": len(w.model_calls),
                "saturated_from_call": saturated,
                "digest": hashlib.sha1(json.dumps(w.messages).encode()).hexdigest()[:16],
                "systems": [],
            }
            for system, python in systems.items():
                # A server per system and workload: its usage is that run's alone.
                with SummaryServer() as server:
                    if system in AUTOCTX_RUNS:
                        r = run_autoctx(db, server, w, args.autoctx_config, system)
                    elif system in ("langchain", "langchain-mask"):
                        r = run_langchain(server, w, tokens, mask=system == "langchain-mask")
                    elif system == "tiered":
                        r = run_tiered(server, w, tokens)
                    else:
                        r = run_openhands(python, server, w)
                    f = figures(w, r, server, tokens, saturated)
                results[name]["systems"].append(f)
                console.print(
                    f"  {name} / {system}: {f['model_calls']:,} model calls in "
                    f"{secs(f['seconds'])} ({r.note})",
                    highlight=False,
                )
            results[name]["systems"] += _reused(args, earlier, name, results[name], systems)
    for res in results.values():
        compare(res)
    print_table(results, machine)
    print_goals(results)
    print_visible(results)
    for system, why in skipped.items():
        console.print(f"skipped {system}: {why}", highlight=False)
    console.print(
        f"cost in input-token equivalents: agent input billed with an ideal prompt cache "
        f"(the prefix equal to the previous call's input at {CACHED_PRICE:.0%}) + summarizer "
        f"input + {OUTPUT_PRICE:g} x summarizer output; total run time "
        f"{secs(time.perf_counter() - started)}",
        highlight=False,
    )
    if args.plot:
        plot(results, args.plot)
        console.print(f"plot {args.plot}", highlight=False)
    return {
        "date": dt.date.today().isoformat(),
        "machine": machine,
        "quick": args.quick,
        "seed": args.seed,
        "skipped": skipped,
        "workloads": results,
    }


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
