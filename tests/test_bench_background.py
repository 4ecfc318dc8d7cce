"""A smoke run of bench/background.py: one --quick workload, a fast summarizer and no model
latency, through the script's own command line, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sqlalchemy.engine import URL

BENCH = Path(__file__).resolve().parent.parent / "bench" / "background.py"


def test_background_quick_toolchat(admin_url: URL, tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--quick",
            "--workloads",
            "toolchat",
            "--summarizer-seconds",
            "0.05",
            "--model-seconds",
            "0",
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
    runs = {r["mode"]: r for r in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"blocking", "background"}
    for r in runs.values():
        assert r["over_window"] == 0
        assert r["summarizer_calls"] > 0
        assert r["model_calls"] == len(r["waits_s"]) > 0
