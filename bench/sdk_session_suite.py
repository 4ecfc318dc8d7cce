"""Run the OpenAI Agents SDK's own session tests against `AutoContextSession`.

The SDK's source distribution carries its test suite. This script fetches it (`pip download
--no-binary :all: --no-deps openai-agents==<the installed version>`), or takes an unpacked one
with `--source`, and runs the test files that exercise a session store with the pytest plugin
`bench/_sdk_session_shim.py`, which puts `AutoContextSession` where the tests build the SDK's
`SQLiteSession`. It prints, for the tests that built a session, how many passed and which
failed, so that each failure can be read and classified (bench/README.md lists them and why).

    pip install -e ".[bench]"          # the SDK, pytest-asyncio and pytest-mock
    AUTOCTX_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test \\
        python bench/sdk_session_suite.py

Without AUTOCTX_DATABASE_URL the sessions live in the embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from importlib.metadata import version
from pathlib import Path

#: The SDK test files that build a `SQLiteSession` and drive it through the Session protocol
#: (directly, or through Runner.run / run_sync / run_streamed).
TEST_FILES = (
    "tests/memory/test_session.py",
    "tests/memory/test_session_limit.py",
    "tests/memory/test_compaction_suffix.py",
    "tests/memory/test_openai_responses_compaction_session.py",
    "tests/test_agent_runner.py",
    "tests/test_agent_runner_streamed.py",
    "tests/test_max_turns.py",
    "tests/test_soft_cancel.py",
    "tests/test_tool_failure_boundaries.py",
    "tests/test_native_tool_failure_history.py",
    "tests/test_tool_batch_failure_history.py",
)


def fetch_source(into: Path) -> Path:
    sdk = version("openai-agents")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-binary",
            ":all:",
            "--no-deps",
            "--dest",
            str(into),
            f"openai-agents=={sdk}",
        ],
        check=True,
    )
    (archive,) = into.glob("openai_agents-*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / f"openai_agents-{sdk}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, help="an unpacked openai-agents sdist")
    parser.add_argument("--show", type=int, default=40, help="failures to list (default 40)")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        source = args.source.resolve() if args.source else fetch_source(work)
        files = [f for f in TEST_FILES if (source / f).exists()]
        report = work / "report.json"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [
                    str(Path(__file__).resolve().parent),
                    str(source),
                    os.environ.get("PYTHONPATH", ""),
                ]
            ),
            "AUTOCTX_SDK_SHIM_REPORT": str(report),
        }
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "_sdk_session_shim",
                "-p",
                "no:cacheprovider",
                *files,
                *args.pytest_args,
            ],
            cwd=source,
            env=env,
            check=False,
        )
        data = json.loads(report.read_text()) if report.exists() else {}
        used, outcomes = set(data.get("used", ())), dict(data.get("outcomes", {}))

    counts: Counter[str] = Counter()
    failures: list[str] = []
    for nodeid, outcome in outcomes.items():
        if nodeid not in used:
            continue
        counts[outcome] += 1
        if outcome == "failed":
            failures.append(nodeid)
    print(f"\nSDK {version('openai-agents')}: {len(outcomes)} tests ran in {len(files)} files;")
    print(
        f"{sum(counts.values())} built an AutoContextSession: "
        + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    )
    for nodeid in failures[: args.show]:
        print(f"  failed: {nodeid}")
    if not outcomes or not used:
        # A suite that could not run (a missing test dependency such as httpx, an sdist
        # without tests) must not read as a pass.
        print("no SDK test ran against an AutoContextSession: this run checked nothing")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
