"""A smoke run of bench/agent_cost.py: autoctx alone on one --quick workload (no peer package
needed), through the script's own command line, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sqlalchemy.engine import URL

BENCH = Path(__file__).resolve().parent.parent / "bench" / "agent_cost.py"


def test_agent_cost_quick_autoctx(admin_url: URL, tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--quick",
            "--systems",
            "autoctx",
            "--workloads",
            "toolchat",
            "--database-url",
            admin_url.render_as_string(hide_password=False),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    [figures] = result["workloads"]["toolchat"]["systems"]
    assert figures["system"] == "autoctx"
    assert figures["calls_over_window"] == 0
    assert figures["summarizer_calls"] > 0
    # Every fact is in the final context or reachable from it by reload.
    assert figures["facts_reachable"] == figures["facts"] > 0
