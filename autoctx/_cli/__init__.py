"""The `autoctx` command: run the demo, manage the schema, and inspect sessions.

    autoctx demo                          # watch a long agent session get compressed
    autoctx sessions                      # what is in the database
    autoctx show SESSION                  # the working context the model sees
    autoctx history SESSION               # every compression: what, why, how much
    autoctx lineage SESSION MESSAGE_ID    # a summary, down to the originals behind it
    autoctx reload SESSION UUID           # what an offload removed
    autoctx dropped SESSION EVENT_ID      # facts of its originals the context no longer shows
    autoctx search QUERY [--session S]    # full-text search over originals, by tenant
    autoctx plot SESSION -o tokens.png    # working tokens over time, compressions marked
    autoctx export SESSION -o s.json      # everything, as JSON (autoctx import restores it)
    autoctx fork SESSION NEW [--at ID]    # branch a session
    autoctx erase SESSION ID... --reason  # erase originals and what derives from them
    autoctx purge --older-than 30d        # retention: delete sessions not updated since
    autoctx worker                        # compress every agent's due sessions, in this process
    autoctx db upgrade | db current       # the schema
    autoctx db grant-tenant ROLE TENANT   # a database role that can use one tenant only
    autoctx ui [--tenant T]               # the audit console in the browser (read-only)

Every command takes ``--database-url`` (default: ``AUTOCTX_DATABASE_URL``, else the embedded
PostgreSQL). Errors print as one line that says what to do, with a non-zero exit code.
"""

from __future__ import annotations

# Importing the command modules registers their commands on `app`.
from . import db, demo, export, facts, inspect, lifecycle, search, ui, worker  # noqa: F401
from .root import app, main

__all__ = ["app", "main"]
