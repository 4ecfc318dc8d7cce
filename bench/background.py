"""How long does the agent wait for compaction? Blocking against background compression.

The tool-chat and long-task workloads of agent_cost.py are replayed through autoctx, one model
call at a time, as an agent would run them: before each model call it stores what came back
(`add()`), calls `compress_if_needed()` and reads its context (`to_openai()`), then "calls the
model" (a sleep of `--model-seconds`). The summarizer is agent_cost.py's deterministic one
behind its local OpenAI-protocol server, made slow: each call takes a seeded uniform
`--summarizer-seconds` (default 1 to 3 s, 2 s on average), as a real LLM writing a summary
does.

- blocking: `AutoContextMemory.open(...)`; `compress_if_needed()` runs the ladder in the
  agent's thread, so the agent waits for every summarizer call.
- background: `AutoContextMemory.open(..., background=True)`; at the trigger the compression
  runs in a thread of the memory's client while the agent goes on; a call waits only when the
  next model call would be over the window.

Per workload and mode: the agent's wait per model call (`compress_if_needed()` plus
`to_openai()`: p50, p95, max, how many over 50 ms, the sum), the `add()` time (the same work
in both modes), model calls whose context is over the window (autoctx's own token count,
which the bound is stated in), the peak (x W), the agent's input summed over its calls and
billed with an ideal prompt cache (as agent_cost.py bills it: the longest prefix, in whole
messages, equal to the previous call's input at 10%), summarizer calls, and wall time.
`--background-token-ratio R` adds a background run whose compression starts earlier, at
`token_ratio=R`.

    python bench/background.py --database-url postgresql://postgres@127.0.0.1:5432/postgres \\
        --plot background.png
    python bench/background.py --quick --summarizer-seconds 0.5,1.5 --model-seconds 0.2
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import BenchDatabase, add_database_argument, fresh_database, machine_description
from _summary_server import SummaryServer
from agent_cost import CACHED_PRICE, QUICK, SIZES, WINDOWS, Workload, longtask, toolchat
from rich.console import Console
from rich.table import Table

from autoctx import AutoContextConfig, AutoContextMemory, OpenAISummarizer, to_openai_messages
from autoctx._messages import from_openai_messages

console = Console(width=240)

WORKLOADS = {"toolchat": toolchat, "longtask": longtask}
MODES = ("blocking", "background")
#: The wait the issue's goal is stated against.
GOAL_MS = 50.0


class SlowSummaryServer(SummaryServer):
    """agent_cost.py's summary server, each answer held for a seeded uniform time in [lo, hi]
    seconds (requests are served concurrently, as an LLM endpoint serves them)."""

    def __init__(self, lo: float, hi: float, seed: int) -> None:
        super().__init__()
        self.lo, self.hi = lo, hi
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()

    def complete(self, body: Mapping[str, Any]) -> dict[str, Any]:
        with self._rng_lock:
            delay = self._rng.uniform(self.lo, self.hi)
        time.sleep(delay)
        return super().complete(body)


@dataclass
class Run:
    workload: str
    mode: str
    window: int
    waits: list[float] = field(default_factory=list)
    adds: list[float] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    #: Each call's input billed with an ideal prompt cache (see `billed`).
    billed: list[float] = field(default_factory=list)
    summarizer_calls: int = 0
    summarizer_seconds: float = 0.0
    seconds: float = 0.0
    compressions: int = 0


def replay(
    db: BenchDatabase,
    server: SlowSummaryServer,
    w: Workload,
    mode: str,
    model_s: float,
    token_ratio: float | None = None,
) -> Run:
    run = Run(w.name, mode, w.window)
    summarizer = OpenAISummarizer(model="autoctx", base_url=server.base_url, api_key="bench")
    config = AutoContextConfig(max_tokens=w.window)
    if token_ratio is not None:
        config = AutoContextConfig(max_tokens=w.window, token_ratio=token_ratio)
    mem = AutoContextMemory.open(
        f"background-{w.name}-{mode}",
        database_url=db.url,
        config=config,
        summarizer=summarizer,
        background=mode != "blocking",
    )
    previous: list[tuple[int, int]] = []
    points = set(w.model_calls)
    pending: list[dict[str, Any]] = []
    started = time.perf_counter()

    def flush() -> None:
        # One add() per model response and its results (the shape rules want a call's
        # results right after it).
        if pending:
            t = time.perf_counter()
            mem.add(from_openai_messages(pending))
            run.adds.append(time.perf_counter() - t)
            pending.clear()

    def model_call() -> None:
        flush()
        t = time.perf_counter()
        mem.compress_if_needed()
        context = mem.messages()
        to_openai_messages(context)  # what `to_openai()` gives the model
        run.waits.append(time.perf_counter() - t)
        run.inputs.append(sum(m.tokens or 0 for m in context))
        keyed = [(m.id or 0, m.tokens or 0) for m in context]
        run.billed.append(billed(previous, keyed))
        previous[:] = keyed
        time.sleep(model_s)  # the model writes its answer

    try:
        for i, m in enumerate(w.messages):
            if i in points:
                model_call()
            if m["role"] != "tool":
                flush()
            pending.append(m)
        flush()
        if len(w.messages) in points:
            model_call()
        run.seconds = time.perf_counter() - started
        mem._wait_background()  # a compression still running belongs to this run
        run.compressions = sum(e.status == "applied" for e in mem.events())
    finally:
        mem.close()
        summarizer.close()
    usage = server.usage.get("autoctx")
    if usage is not None:
        run.summarizer_calls = usage.calls
    return run


def billed(previous: Sequence[tuple[int, int]], current: Sequence[tuple[int, int]]) -> float:
    """A call's input with an ideal prompt cache, as agent_cost.py bills it: the longest prefix
    (in whole messages) equal to the previous call's input at `CACHED_PRICE`, the rest in full."""
    same = 0
    for a, b in zip(previous, current, strict=False):
        if a[0] != b[0]:
            break
        same += 1
    cached = sum(t for _, t in current[:same])
    return CACHED_PRICE * cached + sum(t for _, t in current[same:])


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if seconds >= 0.0995 else f"{seconds * 1000:,.1f} ms"


def figures(run: Run) -> dict[str, Any]:
    waits = sorted(run.waits)
    q = statistics.quantiles(waits, n=100, method="inclusive")
    adds = statistics.quantiles(sorted(run.adds), n=100, method="inclusive")
    return {
        "workload": run.workload,
        "mode": run.mode,
        "window": run.window,
        "model_calls": len(waits),
        "wait_p50_s": q[49],
        "wait_p95_s": q[94],
        "wait_max_s": waits[-1],
        "waits_over_goal": sum(x * 1000 > GOAL_MS for x in waits),
        "wait_total_s": sum(waits),
        "add_p95_s": adds[94],
        "over_window": sum(t >= run.window for t in run.inputs),
        "peak_over_window": max(run.inputs) / run.window,
        "agent_input": sum(run.inputs),
        "agent_billed": round(sum(run.billed)),
        "summarizer_calls": run.summarizer_calls,
        "applied_events": run.compressions,
        "seconds": run.seconds,
        "waits_s": run.waits,
        "inputs": run.inputs,
    }


def print_table(rows: list[dict[str, Any]], machine: str, args: argparse.Namespace) -> None:
    lo, hi = args.summarizer_range
    table = Table(
        title=(
            f"The agent's wait per model call (compress_if_needed + to_openai); summarizer "
            f"{lo:g}-{hi:g} s a call, model {args.model_seconds:g} s a call; {machine}"
        ),
        title_justify="left",
    )
    for name in (
        "workload",
        "mode",
        "calls",
        "wait p50",
        "wait p95",
        "wait max",
        f"> {GOAL_MS:g} ms",
        "waited in all",
        "add p95",
        "over W",
        "peak (x W)",
        "agent input",
        "billed (cache)",
        "summarizer calls",
        "applied",
        "wall",
    ):
        left = name in ("workload", "mode")
        table.add_column(name, justify="left" if left else "right", no_wrap=name == "mode")
    for k, f in enumerate(rows):
        table.add_row(
            f"{f['workload']} (W={f['window']:,})"
            if k == 0 or rows[k - 1]["workload"] != f["workload"]
            else "",
            f["mode"],
            f"{f['model_calls']:,}",
            _ms(f["wait_p50_s"]),
            _ms(f["wait_p95_s"]),
            _ms(f["wait_max_s"]),
            f"{f['waits_over_goal']:,}",
            f"{f['wait_total_s']:,.1f} s",
            _ms(f["add_p95_s"]),
            f"{f['over_window']:,}",
            f"{f['peak_over_window']:.2f}",
            f"{f['agent_input']:,}",
            f"{f['agent_billed']:,}",
            f"{f['summarizer_calls']:,}",
            f"{f['applied_events']:,}",
            f"{f['seconds']:,.0f} s",
            end_section=k < len(rows) - 1 and rows[k + 1]["workload"] != f["workload"],
        )
    console.print(table)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(f["workload"] for f in rows))
    fig, axes = plt.subplots(len(names), 2, figsize=(16, 3.8 * len(names)), squeeze=False)
    palette = iter(["tab:red", "tab:blue", "tab:green", "tab:purple"])
    colors = {m: next(palette) for m in dict.fromkeys(f["mode"] for f in rows)}
    for (ax_wait, ax_input), name in zip(axes, names, strict=True):
        for f in (f for f in rows if f["workload"] == name):
            xs = range(1, len(f["waits_s"]) + 1)
            ax_wait.scatter(
                xs,
                [max(w * 1000, 0.1) for w in f["waits_s"]],
                s=4,
                color=colors[f["mode"]],
                label=f"{f['mode']}: p95 {f['wait_p95_s'] * 1000:,.1f} ms, "
                f"max {f['wait_max_s']:,.2f} s",
            )
            ax_input.plot(
                xs,
                f["inputs"],
                lw=0.8,
                color=colors[f["mode"]],
                label=f"{f['mode']}: peak {f['peak_over_window']:.2f} W, "
                f"{f['summarizer_calls']} summarizer calls",
            )
        ax_wait.axhline(GOAL_MS, color="black", ls="--", lw=0.8, label=f"{GOAL_MS:g} ms")
        ax_wait.set_yscale("log")
        ax_wait.set_title(f"{name}: the agent's wait before each model call")
        ax_wait.set_xlabel("model call")
        ax_wait.set_ylabel("ms (log)")
        ax_wait.legend(loc="upper left", fontsize=8)
        window = rows[[f["workload"] for f in rows].index(name)]["window"]
        ax_input.axhline(window, color="black", lw=0.9, label=f"window {window:,}")
        ax_input.set_title(f"{name}: the context the model gets")
        ax_input.set_xlabel("model call")
        ax_input.set_ylabel("tokens")
        ax_input.set_ylim(0, window * 1.08)
        ax_input.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_database_argument(parser)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--quick", action="store_true", help="agent_cost.py's --quick sizes")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--summarizer-seconds",
        default="1,3",
        help="LO,HI: each summarizer call takes a uniform time in [LO, HI] (one value: fixed)",
    )
    parser.add_argument("--model-seconds", type=float, default=0.5, help="each model call")
    parser.add_argument(
        "--background-token-ratio",
        type=float,
        help="also run background mode with this token_ratio (an earlier start, so that the "
        "compression lands where blocking mode's does)",
    )
    parser.add_argument("--plot", type=Path, help="write waits and inputs per call to this PNG")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    parts = [float(x) for x in args.summarizer_seconds.split(",")]
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or not 0 <= parts[0] <= parts[1]:
        parser.error("--summarizer-seconds takes LO,HI with 0 <= LO <= HI, or one value")
    args.summarizer_range = (parts[0], parts[1])
    args.names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    args.mode_names = [n.strip() for n in args.modes.split(",") if n.strip()]
    unknown = [n for n in args.names if n not in WORKLOADS] + [
        m for m in args.mode_names if m not in MODES
    ]
    if unknown:
        parser.error(f"unknown workloads or modes: {unknown}")
    args.runs = [(m, None) for m in args.mode_names]
    if args.background_token_ratio is not None:
        ratio = args.background_token_ratio
        args.runs.append((f"background@{ratio:g}", ratio))
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    sizes = QUICK if args.quick else SIZES
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with fresh_database(args.database_url, "autoctx_bench_background") as db:
        machine = machine_description(db)
        for name in args.names:
            w = Workload(name, WINDOWS[name], WORKLOADS[name](args.seed, sizes[name]))
            for mode, ratio in args.runs:
                # A server per run: its usage and its delays are that run's alone (the same
                # seed, so both modes draw the same sequence of delays).
                with SlowSummaryServer(*args.summarizer_range, seed=args.seed) as server:
                    f = figures(replay(db, server, w, mode, args.model_seconds, ratio))
                rows.append(f)
                console.print(
                    f"  {name} / {mode}: {f['model_calls']:,} model calls, wait p95 "
                    f"{_ms(f['wait_p95_s'])}, {f['over_window']} over W, {secs_text(f)}",
                    highlight=False,
                )
    print_table(rows, machine, args)
    console.print(f"total run time {time.perf_counter() - started:,.0f} s", highlight=False)
    if args.plot:
        plot(rows, args.plot)
        console.print(f"plot {args.plot}", highlight=False)
    if args.json:
        args.json.write_text(json.dumps({"argv": sys.argv[1:], "machine": machine, "runs": rows}))


def secs_text(f: Mapping[str, Any]) -> str:
    return f"{f['summarizer_calls']} summarizer calls, {f['seconds']:,.0f} s"


if __name__ == "__main__":
    main()
