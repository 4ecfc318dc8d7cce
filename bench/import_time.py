"""How long `import autoctx` takes in a fresh process (issue 33: under 150 ms).

Each run is a new interpreter, so nothing is cached in `sys.modules`; the operating system's
file cache is warm after the first run, as it is for any process that starts after another.
Three figures per run, each the median of `--runs` fresh processes:

- the baseline: the interpreter alone (`python -c pass`), wall-clock from outside;
- `import autoctx`, wall-clock from outside (the interpreter included);
- `import autoctx` measured inside the process (`time.perf_counter` around the import): the
  figure the goal is about.

Then one `python -X importtime -c "import autoctx"` run, and the modules whose own import
(not counting what they import) took longest, autoctx's and its dependencies'.

    python bench/import_time.py [--runs 15] [--top 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

GOAL_MS = 150.0

INSIDE = (
    "import time; t = time.perf_counter(); import autoctx; print((time.perf_counter() - t) * 1000)"
)


def wall_ms(code: str) -> float:
    """Wall-clock of a fresh interpreter running `code`, from outside."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return (time.perf_counter() - start) * 1000


def inside_ms() -> float:
    out = subprocess.run(
        [sys.executable, "-c", INSIDE], check=True, capture_output=True, text=True
    ).stdout
    return float(out.strip())


def importtime(top: int) -> list[tuple[int, int, str]]:
    """(self µs, cumulative µs, module) of one `-X importtime` run, the slowest `top` by self."""
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import autoctx"],
        check=True,
        capture_output=True,
        text=True,
    ).stderr
    rows: list[tuple[int, int, str]] = []
    for line in err.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, cumulative, name = line.removeprefix("import time:").split("|", 2)
        rows.append((int(own), int(cumulative), name.strip()))
    rows.sort(reverse=True)
    return rows[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="fresh processes per figure")
    parser.add_argument("--top", type=int, default=15, help="modules listed from -X importtime")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    wall_ms("import autoctx")  # warm the file cache: every run after it starts alike
    baseline: list[float] = []
    wall: list[float] = []
    inside: list[float] = []
    for _ in range(args.runs):  # interleaved, so that load on the machine hits all three alike
        baseline.append(wall_ms("pass"))
        wall.append(wall_ms("import autoctx"))
        inside.append(inside_ms())

    def row(name: str, values: list[float]) -> str:
        return (
            f"{name:<40} median {statistics.median(values):7.1f} ms   "
            f"min {min(values):7.1f}   max {max(values):7.1f}"
        )

    print(f"python {sys.version.split()[0]}, {args.runs} fresh processes each")
    print(row("baseline: python -c pass (wall)", baseline))
    print(row("python -c 'import autoctx' (wall)", wall))
    print(row("import autoctx (inside the process)", inside))
    median = statistics.median(inside)
    verdict = "met" if median < GOAL_MS else "NOT met"
    print(f"goal: import autoctx under {GOAL_MS:.0f} ms (inside, median): {verdict}")
    print()
    print("slowest modules by their own import time (-X importtime, one run):")
    print(f"{'self ms':>8} {'cumul ms':>9}  module")
    slowest = importtime(args.top)
    for own, cumulative, name in slowest:
        print(f"{own / 1000:8.1f} {cumulative / 1000:9.1f}  {name}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "runs": args.runs,
                    "baseline_ms": baseline,
                    "wall_ms": wall,
                    "inside_ms": inside,
                    "median_inside_ms": median,
                    "goal_ms": GOAL_MS,
                    "slowest": slowest,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
