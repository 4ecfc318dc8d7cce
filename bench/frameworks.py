"""Every framework integration, the same two workloads, with and without autoctx.

For each module `bench/_fw_<name>.py` (its `NAME` and `run(workload, *, use_autoctx,
database_url, window)`), runs the framework's own agent loop against the local Chat Completions
server with the scripted agent of tests/agent_model.py, which counts the input tokens of every
request it receives:

- "long": one run of 48 tool calls whose outputs are 2-20 KB;
- "short": 25 runs of 3 such calls in one session (thread).

and prints per framework and workload the largest request against the window, the requests
over the window (0 with autoctx), the summarizer calls (compression events that ran a
summarizer; the offline one here) and the tool calls, with autoctx and without.

    python bench/frameworks.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
    python bench/frameworks.py --only langchain --window 8000
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import add_database_argument, fresh_database

WORKLOADS = ("long", "short")


def framework_modules(only: Sequence[str]) -> list[Any]:
    names = sorted(p.stem for p in Path(__file__).resolve().parent.glob("_fw_*.py"))
    if only:
        names = [n for n in names if n.removeprefix("_fw_") in only]
    return [importlib.import_module(name) for name in names]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_database_argument(parser)
    parser.add_argument("--window", type=int, default=16_000, help="max_tokens (default 16000)")
    parser.add_argument(
        "--only", nargs="*", default=[], help="framework modules to run (the part after _fw_)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    modules = framework_modules(args.only)
    rows: list[tuple[str, str, str, dict[str, int]]] = []
    over = 0
    with fresh_database(args.database_url, "autoctx_bench_fw") as db:
        url = db.url.render_as_string(hide_password=False)
        for module in modules:
            for workload in WORKLOADS:
                for use in (True, False):
                    figures = module.run(
                        workload, use_autoctx=use, database_url=url, window=args.window
                    )
                    side = "autoctx" if use else "without"
                    rows.append((module.NAME, workload, side, figures))
                    if use:
                        over += figures["over_window"]
                    print(f"{module.NAME} / {workload} / {side}: {figures}", flush=True)
    print()
    print(
        "| framework | workload | | largest request / window | requests | over the window "
        "| summarizer calls | tool calls |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, workload, side, f in rows:
        print(
            f"| {name} | {workload} | {side} | {f['largest_request']:,} / {args.window:,} "
            f"| {f['requests']} | {f['over_window']} | {f['summarizer_calls']} "
            f"| {f['tool_calls']} |"
        )
    if over:
        print(f"\n{over} request(s) with autoctx were over the window")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
