"""How long `import autoctx` takes in a fresh process (issue 33: under 150 ms).

Each run is a new interpreter, so nothing is cached in `sys.modules`; the operating system's
file cache is warm after the first run, as it is for any process that starts after another.
Each figure is the median of `--runs` fresh processes:

- the baselines: the interpreter alone (`python -c pass`), and SQLAlchemy alone (`import
  sqlalchemy`, timed inside: what a library that loads its SQL toolkit at import pays),
  measured in the same run;
- `import autoctx`, wall-clock from outside (the interpreter included);
- `import autoctx` measured inside the process (`time.perf_counter` around the import): the
  figure the goal is about;
- `from autoctx import AutoContextMemory`, inside: what a program that opens a memory pays at
  its first use of it (the memory, the store, SQLAlchemy and psycopg load then).

With `--against DIR` (another checkout of autoctx, an older commit say), its `import autoctx`
too, inside, interleaved with the rest: a before and after in one run, under one load.

Then one `python -X importtime -c "import autoctx"` run, and the modules whose own import
(not counting what they import) took longest, autoctx's and its dependencies'.

    python bench/import_time.py [--runs 15] [--top 15] [--against DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

GOAL_MS = 150.0

#: Statements timed inside a fresh process.
IMPORT_AUTOCTX = "import autoctx"
IMPORT_SQLALCHEMY = "import sqlalchemy"
IMPORT_MEMORY = "from autoctx import AutoContextMemory"


def wall_ms(code: str) -> float:
    """Wall-clock of a fresh interpreter running `code`, from outside."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return (time.perf_counter() - start) * 1000


def inside_ms(statement: str, source: str | None = None) -> float:
    """`statement` timed inside a fresh interpreter (its start-up not counted); with `source`,
    the autoctx of that checkout (run from there: `python -c` puts the working directory
    first on the path)."""
    code = (
        f"import time; t = time.perf_counter(); {statement}; "
        "print((time.perf_counter() - t) * 1000)"
    )
    env = None if source is None else {**os.environ, "PYTHONPATH": source}
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=source,
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
    parser.add_argument(
        "--against", metavar="DIR", help="another checkout of autoctx, measured beside this one"
    )
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    against = None if args.against is None else os.path.abspath(args.against)
    if against is not None and not os.path.isfile(os.path.join(against, "autoctx", "__init__.py")):
        parser.error(f"--against {args.against}: no autoctx/__init__.py there")

    wall_ms(IMPORT_MEMORY)  # warm the file cache: every run after it starts alike
    baseline: list[float] = []
    sqlalchemy: list[float] = []
    wall: list[float] = []
    inside: list[float] = []
    memory: list[float] = []
    other: list[float] = []
    for _ in range(args.runs):  # interleaved, so that load on the machine hits all alike
        baseline.append(wall_ms("pass"))
        sqlalchemy.append(inside_ms(IMPORT_SQLALCHEMY))
        wall.append(wall_ms(IMPORT_AUTOCTX))
        inside.append(inside_ms(IMPORT_AUTOCTX))
        memory.append(inside_ms(IMPORT_MEMORY))
        if against is not None:
            other.append(inside_ms(IMPORT_AUTOCTX, against))

    def row(name: str, values: list[float]) -> str:
        return (
            f"{name:<48} median {statistics.median(values):7.1f} ms   "
            f"min {min(values):7.1f}   max {max(values):7.1f}"
        )

    print(f"python {sys.version.split()[0]}, {args.runs} fresh processes each")
    print(row("baseline: python -c pass (wall)", baseline))
    print(row("baseline: import sqlalchemy (inside)", sqlalchemy))
    print(row("python -c 'import autoctx' (wall)", wall))
    print(row("import autoctx (inside the process)", inside))
    print(row("from autoctx import AutoContextMemory (inside)", memory))
    if against is not None:
        print(row("--against: import autoctx (inside)", other))
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
                    "sqlalchemy_ms": sqlalchemy,
                    "memory_ms": memory,
                    "against": against,
                    "against_ms": other,
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
