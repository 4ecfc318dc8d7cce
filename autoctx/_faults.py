"""Test-only pause points, so that crash tests can kill a process inside a given phase.

Set `AUTOCTX_PAUSE_AT` to a phase name; when the process reaches that phase it writes
"PAUSED <phase>" to stderr and sleeps until killed. Unset (the normal case), a pause point costs
one dictionary lookup.
"""

from __future__ import annotations

import os
import sys
import time

ENV = "AUTOCTX_PAUSE_AT"

#: The phases that have a pause point.
PHASES = (
    # inside an append transaction, rows written, not committed: only a process's first append
    # (which locks the session row and writes in several statements) has this window; the
    # usual append is one autocommit statement
    "append.before_commit",
    "append.after_commit",  # every append: committed, not yet returned to the caller
    "summarize.during",  # while the summariser call is in flight (no lock held)
    "apply.after_lock",  # inside the apply transaction, session row locked, nothing written
    "apply.before_commit",  # inside the apply transaction, everything written, not committed
)


def pause_point(phase: str) -> None:
    if os.environ.get(ENV) == phase:
        sys.stderr.write(f"PAUSED {phase}\n")
        sys.stderr.flush()
        while True:
            time.sleep(3600)
