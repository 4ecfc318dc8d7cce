"""Does autoctx keep a session under its window, step by step, as an agent loop drives it?

Each workload is fed one message at a time, the way an agent loop uses autoctx: `add()` one
message, then `compress_if_needed()` (timed), with `AutoContextConfig(max_tokens=W)` and every
other threshold at its default (or those of `--autoctx-config JSON`), the deterministic
`OfflineSummarizer` (wrapped to count its calls). Seeded: the same flags give the same
messages, and the same figures but for the times.

- `chat`: 3,000 small rounds (user 50-300 tokens, answer 200-1,500 tokens; about one round in
  four makes one tool call, its output 100-600 tokens, before the answer), W = 131,072;
- `chat-small`: the same chat, W = 16,000;
- `toolchat`: 2,000 Agents-SDK-like turns (user, 1 or 2 tool calls, each with its own assistant
  message or both in one parallel message, outputs 200-800 tokens, an answer), W = 131,072;
- `sdk-runner`: 800 turns of the same kind driven through the real Agents SDK `Runner.run`, with
  `AutoContextSession` as the session (it compresses inside `add_items` itself) and a scripted,
  deterministic model (no network): 1 or 2 function calls, then a final text; W = 131,072. A
  step here is one `add_items` call of the SDK;
- `multitask`: 15 agent trajectories in one session: tasks of 10 to 300 steps, each opening
  with its own system message and a user message, steps of tool calls and outputs of real
  sizes (log-normal, 100 characters to 20 KB), 13 of the 15 tasks ending without a final
  answer, W = 32,000;
- `longtask`: one task of 2,000 tool steps after a single user message, W = 32,000;
- `trajectories` (with `--trajectories DIR`): the JSON files of DIR in name order, each an
  OpenAI-format list of chat messages or {"messages": [...]}, fed into one session, W from
  `--window`.

Printed, one row per workload for autoctx and one for "no compression" (the same messages, the
tokens only grow): the window; the peak of the working tokens after each step's compression
(and as a multiple of the window); the final tokens; the steps that end over the window (0
when autoctx bounds the session); summarizer calls in all and per step once saturated (from the
first step whose call applied something on); the fired calls (the token or count trigger held
just before the call) and the share of them that ended under the token target; the call's
p50/p95 per step, and its p50 over the first tenth of the steps against the last tenth (how
the cost grows with the session); the applied events by strategy ("2:14 4:3": strategy 2
applied 14 times, strategy 4 three times).

    python bench/bounded.py                                  # all six, embedded PostgreSQL
    python bench/bounded.py --scale 0.1 --workloads chat,longtask --plot plots/
    python bench/bounded.py --trajectories runs/ --window 32000 --workloads trajectories

Needs the `openai-agents` package for `sdk-runner` and matplotlib for `--plot`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import math
import random
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

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
    percentile,
    secs,
    tool_turn,
    trajectories,
)
from _facts_visible import LossySummarizer, index_line_tokens
from rich.console import Console
from rich.table import Table

from autoctx import (
    AutoContextConfig,
    AutoContextMemory,
    Event,
    Msg,
    OfflineSummarizer,
    Summarizer,
    SummaryRequest,
    SummaryResult,
    ToolResultBlock,
)
from autoctx._tokens import TokenCounter

console = Console(width=200)

MessageInput: TypeAlias = Msg | dict[str, Any]

WORKLOADS = ("chat", "chat-small", "toolchat", "sdk-runner", "multitask", "longtask")
WINDOWS = {
    "chat": 131_072,
    "chat-small": 16_000,
    "toolchat": 131_072,
    "sdk-runner": 131_072,
    "multitask": 32_000,
    "longtask": 32_000,
}
# Full sizes: rounds, turns, tasks' steps (scaled by --scale).
CHAT_ROUNDS = 3_000
TOOLCHAT_TURNS = 2_000
SDK_TURNS = 800
MULTITASK_TASKS = 15
MULTITASK_ANSWERED = 2
LONGTASK_STEPS = 2_000


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_database_argument(parser)
    add_config_argument(parser)
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated, of {', '.join((*WORKLOADS, 'trajectories'))} (default: the six)",
    )
    parser.add_argument(
        "--scale", type=float, default=1.0, help="shorten every workload by this factor (0.1)"
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--trajectories", type=Path, help="a directory of JSON trajectories (workload trajectories)"
    )
    parser.add_argument(
        "--window", type=int, default=32_000, help="max_tokens of the trajectories workload"
    )
    parser.add_argument(
        "--lossy",
        action="store_true",
        help="summarize with a stub that drops every fact (the fact check's repair and index "
        "line keep them in view) instead of the offline summarizer",
    )
    parser.add_argument("--plot", type=Path, help="write one PNG per workload to this directory")
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
    if not 0 < args.scale <= 1:
        parser.error("--scale must be in (0, 1]")
    args.names = names
    return args


# ---------------------------------------------------------------------------------------------
# The workloads (generators of messages, one step each)
# ---------------------------------------------------------------------------------------------


def _scaled(n: int, scale: float, least: int = 1) -> int:
    return max(least, round(n * scale))


def chat(seed: int, scale: float) -> Iterator[Msg]:
    gen = TranscriptGenerator(seed)
    texts, r, calls = Texts(gen), gen.r, Calls()
    for _ in range(_scaled(CHAT_ROUNDS, scale)):
        yield Msg.user(texts.text("prose", r.randint(50, 300)))
        if r.random() < 0.25:
            call = calls.new(r)
            yield Msg.assistant(None, [call])
            yield Msg.tool(
                call.id, texts.text(TOOL_OUTPUT_KINDS[call.name], r.randint(100, 600)), call.name
            )
        yield Msg.assistant(texts.text("prose", r.randint(200, 1500)))


def toolchat(seed: int, scale: float) -> Iterator[Msg]:
    gen = TranscriptGenerator(seed)
    texts, r, calls = Texts(gen), gen.r, Calls()
    for _ in range(_scaled(TOOLCHAT_TURNS, scale)):
        user, responses = tool_turn(gen, texts, calls)
        yield Msg.user(user)
        for response in responses:
            if isinstance(response, str):
                yield Msg.assistant(response)
                continue
            yield Msg.assistant(None, response)
            for call in response:
                output = texts.text(TOOL_OUTPUT_KINDS[call.name], r.randint(200, 800))
                yield Msg.tool(call.id, output, call.name)


def _step_messages(gen: TranscriptGenerator) -> Iterator[Msg]:
    # TranscriptGenerator.step: 1 call (70%) or 2-4 parallel ones, outputs log-normal in
    # [100 chars, 20 KB], median 800 chars: the sizes real coding agents see.
    yield from gen.step()


def multitask(seed: int, scale: float) -> Iterator[Msg]:
    gen = TranscriptGenerator(seed)
    texts, r = Texts(gen), gen.r
    # Log-uniform lengths between 10 and 300 steps, as agent benchmarks' trajectories spread.
    lengths = [round(math.exp(r.uniform(math.log(10), math.log(300)))) for _ in range(15)]
    answered = set(r.sample(range(MULTITASK_TASKS), MULTITASK_ANSWERED))
    for task, steps in enumerate(lengths):
        # Every trajectory brings its own system prompt, as a harness that reuses a session
        # for its next task does; real agent prompts run to a thousand tokens or more.
        yield Msg.system(f"You are agent task {task}. " + texts.text("prose", r.randint(400, 1500)))
        yield gen.user()
        for _ in range(_scaled(steps, scale)):
            yield from _step_messages(gen)
        if task in answered:
            yield gen.answer()


def longtask(seed: int, scale: float) -> Iterator[Msg]:
    gen = TranscriptGenerator(seed)
    texts = Texts(gen)
    yield Msg.system("You are a coding agent. " + texts.text("prose", 600))
    yield gen.user()
    for _ in range(_scaled(LONGTASK_STEPS, scale)):
        yield from _step_messages(gen)


# ---------------------------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------------------------


class CountingSummarizer:
    """Delegates to a summarizer and counts its calls (and says what the inner one says of
    shared requests and repairs: the offline summarizer is asked no repair)."""

    def __init__(self, inner: Summarizer) -> None:
        self.inner = inner
        self.calls = 0
        self.repairs = 0
        self.answers_shared_requests = getattr(inner, "answers_shared_requests", False) is True
        self.repairs_summaries = getattr(inner, "repairs_summaries", True) is not False

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        self.repairs += bool(request.missing_facts)
        return self.inner.summarize(request)


@dataclass
class Trace:
    """What each step left behind."""

    name: str
    window: int
    trigger: int
    target: int
    tokens: list[int] = field(default_factory=list)
    messages: list[int] = field(default_factory=list)
    baseline: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    fired: list[bool] = field(default_factory=list)
    applied: list[bool] = field(default_factory=list)
    strategies: Counter[int] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    # Failed events by strategy and reason: why a rung did not help.
    failures: Counter[str] = field(default_factory=Counter)
    elapsed: float = 0.0
    #: Of the facts planted so far, the share the working context shows verbatim after each
    #: step from the first compression on, and the steps that compressed (docs/design.md §6).
    visible: list[float] = field(default_factory=list)
    visible_after: list[float] = field(default_factory=list)
    #: Tokens of the fact check's index lines in the working context, summed over the steps
    #: (each step's model call sends them again), and the repair calls.
    index_tokens_sent: int = 0
    repairs: int = 0

    def record(
        self,
        *,
        tokens: int,
        messages: int,
        baseline: int,
        seconds: float,
        calls: int,
        fired: bool,
        events: Sequence[Event],
    ) -> None:
        self.tokens.append(tokens)
        self.messages.append(messages)
        self.baseline.append(baseline)
        self.seconds.append(seconds)
        self.calls.append(calls)
        self.fired.append(fired)
        self.applied.append(any(e.status == "applied" for e in events))
        for e in events:
            self.statuses[e.status] += 1
            if e.status == "applied":
                self.strategies[e.strategy] += 1
            elif e.status == "failed":
                # The machine reason before the first colon; the rest carries figures.
                reason = (e.error or "?").split(":", 1)[0]
                self.failures[f"S{e.strategy} {reason}"] += 1


def _new_trace(name: str, config: AutoContextConfig) -> Trace:
    return Trace(name, config.max_tokens, config.token_trigger, config.token_target)


def run_memory(
    db: BenchDatabase,
    name: str,
    window: int,
    msgs: Iterable[MessageInput],
    fields: dict[str, Any] | None = None,
    lossy: bool = False,
) -> Trace:
    """The agent loop: add one message, compress if needed, read the totals; and which of the
    planted facts the working context shows after each step."""
    started = time.perf_counter()
    summarizer = CountingSummarizer(LossySummarizer() if lossy else OfflineSummarizer())
    config = AutoContextConfig(max_tokens=window, **(fields or {}))
    mem = AutoContextMemory.open(
        f"bounded-{name}", database_url=db.url, config=config, summarizer=summarizer
    )
    trace = _new_trace(name, mem.config)
    grown = 0
    planted: set[str] = set()
    shown: set[str] = set()
    index_tokens = 0
    compressed = False
    counter = TokenCounter("gpt-4o")
    try:
        for msg in plant_facts(msgs, name):
            # What the session would hold without compression: every stored message's tokens.
            added = mem.add(msg)
            grown += sum(m.tokens or 0 for m in added)
            new_facts = {f for m in added for f in FACT_RE.findall(_text(m))}
            planted |= new_facts
            fired = mem.needs_compression()
            before = summarizer.calls
            t0 = time.perf_counter()
            events = mem.compress_if_needed()
            seconds = time.perf_counter() - t0
            if any(e.status == "applied" for e in events):
                # The context was rewritten: read it whole (between compressions it only grows).
                compressed = True
                working = [_text(m) for m in mem.messages()]
                shown = {f for text in working for f in FACT_RE.findall(text)}
                index_tokens = sum(index_line_tokens(text, counter) for text in working)
                trace.visible_after.append(len(shown & planted) / max(1, len(planted)))
            else:
                shown |= new_facts
            if compressed:
                trace.visible.append(len(shown & planted) / max(1, len(planted)))
                trace.index_tokens_sent += index_tokens
            info = mem.refresh()
            trace.record(
                tokens=info.token_count,
                messages=info.message_count,
                baseline=grown,
                seconds=seconds,
                calls=summarizer.calls - before,
                fired=fired,
                events=events,
            )
            _progress(trace)
    finally:
        mem.close()
    trace.repairs = summarizer.repairs
    trace.elapsed = time.perf_counter() - started
    return trace


#: The fact planted in every tool output (as agent_cost.py plants them).
FACT_RE = re.compile(r"fact_id=F\d{5}-[0-9a-f]{6}")


def plant_facts(msgs: Iterable[MessageInput], name: str) -> Iterator[MessageInput]:
    """`msgs` with one unique fact marker at the end of every tool output (seeded by the
    workload's name), the facts whose visibility the run measures."""
    r = random.Random(name)
    n = 0
    for msg in msgs:
        if isinstance(msg, Msg) and msg.role == "tool":
            blocks: list[Any] = []
            for b in msg.content:
                if isinstance(b, ToolResultBlock):
                    n += 1
                    marker = f"fact_id=F{n:05d}-{r.getrandbits(24):06x}"
                    b = ToolResultBlock(b.tool_use_id, f"{b.output_text}\n{marker}", b.name)
                blocks.append(b)
            msg = dataclasses.replace(msg, content=tuple(blocks))
        yield msg


def _text(m: Msg) -> str:
    """What the model reads of a message: its text and its tool outputs."""
    parts = [m.text]
    parts += [r.output_text for r in m.tool_results]
    return "\n".join(p for p in parts if p)


def _progress(trace: Trace) -> None:
    n = len(trace.tokens)
    if n % 2000 == 0:
        console.print(
            f"  {trace.name}: {n:,} steps, {trace.tokens[-1]:,} working tokens", highlight=False
        )


# ---------------------------------------------------------------------------------------------
# sdk-runner: the real Agents SDK Runner over AutoContextSession, with a scripted model
# ---------------------------------------------------------------------------------------------


def run_sdk(
    db: BenchDatabase, seed: int, scale: float, fields: dict[str, Any] | None = None
) -> Trace:
    return asyncio.run(_run_sdk(db, seed, scale, fields))


async def _run_sdk(
    db: BenchDatabase, seed: int, scale: float, fields: dict[str, Any] | None
) -> Trace:
    # Imported here: the other workloads do not need the SDK installed.
    from agents import Agent, FunctionTool, Runner, Tool, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.tool_context import ToolContext
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    from autoctx.integrations.openai_agents import AutoContextSession

    set_tracing_disabled(True)  # no trace export: no network
    gen = TranscriptGenerator(seed)
    texts, calls = Texts(gen), Calls()
    outputs: dict[str, str] = {}

    class ScriptedModel(Model):
        """Answers a turn with the responses of its script, one per model call."""

        def __init__(self) -> None:
            self.script: list[Any] = []
            self.n = 0

        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            self.n += 1
            response = self.script.pop(0)
            output: list[Any]
            if isinstance(response, str):
                output = [
                    ResponseOutputMessage(
                        id=f"msg_{self.n}",
                        type="message",
                        role="assistant",
                        status="completed",
                        content=[
                            ResponseOutputText(type="output_text", text=response, annotations=[])
                        ],
                    )
                ]
            else:
                output = [
                    ResponseFunctionToolCall(
                        type="function_call",
                        id=f"fc_{call.id}",
                        call_id=call.id,
                        name=call.name,
                        arguments=call.arguments,
                        status="completed",
                    )
                    for call in response
                ]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            raise NotImplementedError("the bench runs Runner.run, not streamed")

    async def invoke(ctx: ToolContext[Any], arguments: str) -> str:
        # The output was drawn when the turn was scripted, so that parallel calls, run
        # concurrently by the SDK, cannot change the random stream.
        return outputs.pop(ctx.tool_call_id)

    tools: list[Tool] = [
        FunctionTool(
            name=tool,
            description=f"the {tool} tool",
            params_json_schema={"type": "object", "properties": {}, "additionalProperties": True},
            on_invoke_tool=invoke,
            strict_json_schema=False,
        )
        for tool in TOOL_OUTPUT_KINDS
    ]
    model = ScriptedModel()
    agent = Agent(name="bench", instructions="You are a coding agent.", model=model, tools=tools)

    summarizer = CountingSummarizer(OfflineSummarizer())
    session = AutoContextSession(
        "bounded-sdk-runner",
        db.url,
        AutoContextConfig(max_tokens=WINDOWS["sdk-runner"], **(fields or {})),
        summarizer=summarizer,
    )
    mem = session.memory()
    trace = _new_trace("sdk-runner", mem.config)
    started = time.perf_counter()

    # A step is one add_items call of the SDK. AutoContextSession compresses inside it, only when
    # its append left the session over the trigger; the wrappers below see that call.
    original_add, original_compress = mem.add, mem.compress_if_needed
    original_add_items = session.add_items_sync
    step: dict[str, Any] = {}

    def add(messages: Any) -> list[Msg]:
        stored: list[Msg] = original_add(messages)
        step["grown"] += sum(m.tokens or 0 for m in stored)
        return stored

    def compress_if_needed() -> list[Event]:
        step["fired"] = mem.needs_compression()
        before = summarizer.calls
        t0 = time.perf_counter()
        events: list[Event] = original_compress()
        step["seconds"] += time.perf_counter() - t0
        step["calls"] += summarizer.calls - before
        step["events"].extend(events)
        return events

    def add_items_sync(items: Sequence[Any]) -> None:
        step.update(seconds=0.0, calls=0, fired=False, events=[])
        original_add_items(items)
        info = mem.refresh()
        trace.record(
            tokens=info.token_count,
            messages=info.message_count,
            baseline=step["grown"],
            seconds=step["seconds"],
            calls=step["calls"],
            fired=step["fired"],
            events=step["events"],
        )
        _progress(trace)

    step["grown"] = 0
    # Instance attributes shadow the methods: AutoContextSession looks them up on each call.
    mem.add = add  # type: ignore[method-assign]
    mem.compress_if_needed = compress_if_needed  # type: ignore[method-assign]
    session.add_items_sync = add_items_sync  # type: ignore[method-assign]
    try:
        for _ in range(_scaled(SDK_TURNS, scale)):
            user, responses = tool_turn(gen, texts, calls)
            for response in responses:
                if not isinstance(response, str):
                    for call in response:
                        outputs[call.id] = texts.text(
                            TOOL_OUTPUT_KINDS[call.name], gen.r.randint(200, 800)
                        )
            model.script = responses
            await Runner.run(agent, user, session=session, max_turns=len(responses) + 1)
            if model.script or outputs:
                raise SystemExit("sdk-runner: the SDK did not play the whole script of a turn")
    finally:
        mem.close()
    trace.elapsed = time.perf_counter() - started
    return trace


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------


def _tenth(values: Sequence[float], last: bool) -> float:
    k = max(1, len(values) // 10)
    part = values[-k:] if last else values[:k]
    return percentile(part, 50)


def figures(t: Trace) -> dict[str, Any]:
    n = len(t.tokens)
    saturated_at = next((k for k, a in enumerate(t.applied) if a), None)
    fired = [k for k in range(n) if t.fired[k]]
    under = sum(1 for k in fired if t.tokens[k] < t.target)
    saturated_steps = n - saturated_at if saturated_at is not None else 0
    saturated_calls = sum(t.calls[saturated_at:]) if saturated_at is not None else 0
    return {
        "window": t.window,
        "trigger": t.trigger,
        "target": t.target,
        "steps": n,
        "seconds": t.elapsed,
        "autoctx": {
            "peak_tokens": max(t.tokens, default=0),
            "peak_over_window": max(t.tokens, default=0) / t.window,
            "final_tokens": t.tokens[-1] if t.tokens else 0,
            "final_messages": t.messages[-1] if t.messages else 0,
            "steps_over_window": sum(1 for x in t.tokens if x > t.window),
            "summarizer_calls": sum(t.calls),
            "saturated_from_step": saturated_at,
            "summarizer_calls_per_saturated_step": (
                saturated_calls / saturated_steps if saturated_steps else 0.0
            ),
            "fired_calls": len(fired),
            "fired_under_target": under,
            "fired_under_target_share": under / len(fired) if fired else None,
            "compress_p50_ms": percentile(t.seconds, 50) * 1000,
            "compress_p95_ms": percentile(t.seconds, 95) * 1000,
            "compress_p50_first_tenth_ms": _tenth(t.seconds, last=False) * 1000,
            "compress_p50_last_tenth_ms": _tenth(t.seconds, last=True) * 1000,
            "compress_total_s": sum(t.seconds),
            "applied_by_strategy": {str(k): v for k, v in sorted(t.strategies.items())},
            "events_by_status": dict(sorted(t.statuses.items())),
            "failed": dict(t.failures.most_common()),
            "visible_steps": len(t.visible),
            "visible_mean": sum(t.visible) / len(t.visible) if t.visible else None,
            "visible_after_compression_min": min(t.visible_after, default=None),
            "visible_after_compression_mean": (
                sum(t.visible_after) / len(t.visible_after) if t.visible_after else None
            ),
            "check_repair_calls": t.repairs,
            "check_index_tokens_sent": t.index_tokens_sent,
        },
        "no_compression": {
            "peak_tokens": max(t.baseline, default=0),
            "peak_over_window": max(t.baseline, default=0) / t.window,
            "final_tokens": t.baseline[-1] if t.baseline else 0,
            "steps_over_window": sum(1 for x in t.baseline if x > t.window),
        },
    }


def _strategies(counts: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in counts.items()) or "-"


def print_table(results: dict[str, dict[str, Any]], machine: str) -> None:
    table = Table(title=f"Working tokens under compress_if_needed() after every add ({machine})")
    for header, justify in (
        ("workload", "left"),
        ("side", "left"),
        ("window", "right"),
        ("steps", "right"),
        ("peak (x W)", "right"),
        ("final", "right"),
        ("steps > W", "right"),
        ("summ. calls", "right"),
        ("per step sat.", "right"),
        ("fired", "right"),
        ("under target", "right"),
        ("p50 / p95 ms", "right"),
        ("p50 first -> last 10%", "right"),
        ("applied by strategy", "left"),
    ):
        # Figures stay on one line; only the strategy list may wrap.
        table.add_column(
            header,
            justify=justify,  # type: ignore[arg-type]
            no_wrap=header != "applied by strategy",
        )
    for name, f in results.items():
        a, b = f["autoctx"], f["no_compression"]
        share = a["fired_under_target_share"]
        table.add_row(
            name,
            "autoctx",
            f"{f['window']:,}",
            f"{f['steps']:,}",
            f"{a['peak_tokens']:,} ({a['peak_over_window']:.2f}x)",
            f"{a['final_tokens']:,}",
            f"{a['steps_over_window']:,}",
            f"{a['summarizer_calls']:,}",
            f"{a['summarizer_calls_per_saturated_step']:.2f}",
            f"{a['fired_calls']:,}",
            f"{share:.0%}" if share is not None else "-",
            f"{a['compress_p50_ms']:,.1f} / {a['compress_p95_ms']:,.1f}",
            f"{a['compress_p50_first_tenth_ms']:,.1f} -> {a['compress_p50_last_tenth_ms']:,.1f}",
            _strategies(a["applied_by_strategy"]),
        )
        table.add_row(
            "",
            "no compression",
            f"{f['window']:,}",
            f"{f['steps']:,}",
            f"{b['peak_tokens']:,} ({b['peak_over_window']:.2f}x)",
            f"{b['final_tokens']:,}",
            f"{b['steps_over_window']:,}",
            "0",
            "-",
            "-",
            "-",
            "-",
            "-",
            "-",
            end_section=True,
        )
    console.print(table)
    for name, f in results.items():
        a = f["autoctx"]
        console.print(
            f"{name}: {f['steps']:,} steps in {secs(f['seconds'])} "
            f"(compress_if_needed {secs(a['compress_total_s'])}); trigger {f['trigger']:,}, "
            f"target {f['target']:,} tokens; saturated from step "
            f"{a['saturated_from_step'] if a['saturated_from_step'] is not None else '-'}; "
            f"final {a['final_messages']:,} working messages; events "
            f"{' '.join(f'{k}:{v}' for k, v in a['events_by_status'].items()) or '-'}",
            highlight=False,
        )
        if a["failed"]:
            failed = ", ".join(f"{reason} {count:,}" for reason, count in a["failed"].items())
            console.print(f"  failed events: {failed}", highlight=False)
        if a.get("visible_mean") is not None:
            console.print(
                f"  planted facts visible verbatim after each step from the first compression "
                f"on: mean {a['visible_mean']:.2f} over {a['visible_steps']:,} steps; right "
                f"after a compression lowest {a['visible_after_compression_min']:.2f}, mean "
                f"{a['visible_after_compression_mean']:.2f} (no compression: 1.00, unbounded)",
                highlight=False,
            )
            console.print(
                f"  fact check cost: {a['check_repair_calls']:,} repair calls; index lines "
                f"{a['check_index_tokens_sent']:,} tokens sent over all steps",
                highlight=False,
            )


def plot(trace: Trace, directory: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    steps = range(1, len(trace.tokens) + 1)
    fig, ax = plt.subplots(figsize=(11, 5))
    ax.plot(steps, trace.tokens, lw=0.8, color="tab:blue", label="working tokens (autoctx)")
    marks = [k for k, c in enumerate(trace.calls) if c]
    ax.scatter(
        [k + 1 for k in marks],
        [trace.tokens[k] for k in marks],
        s=6,
        color="tab:red",
        zorder=3,
        label=f"summarizer called ({sum(trace.calls):,} calls)",
    )
    for value, label, style in (
        (trace.window, "window", "-"),
        (trace.trigger, "trigger", "--"),
        (trace.target, "target", ":"),
    ):
        ax.axhline(value, color="black", ls=style, lw=0.9, label=f"{label} {value:,}")
    top = max(trace.tokens, default=0)
    ax.set_ylim(0, max(top, trace.window) * 1.1)
    ax.set_xlabel("step (one message added, then compress_if_needed)")
    ax.set_ylabel("tokens")
    final = trace.baseline[-1] if trace.baseline else 0
    ax.set_title(
        f"{trace.name}: W={trace.window:,}; without compression the session would end at "
        f"{final:,} tokens ({final / trace.window:.1f}x W)"
    )
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = directory / f"bounded-{trace.name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def _workload(args: argparse.Namespace, db: BenchDatabase, name: str) -> Trace:
    seed, scale = args.seed, args.scale
    makers: dict[str, Callable[[], Iterable[MessageInput]]] = {
        "chat": lambda: chat(seed, scale),
        "chat-small": lambda: chat(seed, scale),
        "toolchat": lambda: toolchat(seed, scale),
        "multitask": lambda: multitask(seed, scale),
        "longtask": lambda: longtask(seed, scale),
        "trajectories": lambda: trajectories(args.trajectories),
    }
    if name == "sdk-runner":
        return run_sdk(db, seed, scale, args.autoctx_config)
    window = args.window if name == "trajectories" else WINDOWS[name]
    return run_memory(db, name, window, makers[name](), args.autoctx_config, args.lossy)


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    with fresh_database(args.database_url, "autoctx_bench_bounded") as db:
        machine = machine_description(db)
        console.print(f"database {db.name} on PostgreSQL {db.server_version}; scale {args.scale}")
        for name in args.names:
            trace = _workload(args, db, name)
            results[name] = figures(trace)
            console.print(
                f"  {name}: {len(trace.tokens):,} steps in {secs(trace.elapsed)}", highlight=False
            )
            if args.plot:
                console.print(f"  plot {plot(trace, args.plot)}", highlight=False)
    print_table(results, machine)
    total = time.perf_counter() - started
    console.print(f"total run time {secs(total)}", highlight=False)
    return {
        "date": dt.date.today().isoformat(),
        "machine": machine,
        "scale": args.scale,
        "seed": args.seed,
        "seconds": total,
        "workloads": results,
    }


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
