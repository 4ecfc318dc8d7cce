"""Operators' calls on whole sessions: export, import (restore) and retention.

`mem.fork()` and `mem.erase()` are methods of a memory; these act on sessions by id, like the
CLI commands that call them (`autoctx export`, `autoctx import`, `autoctx purge`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.engine import URL

from . import _arguments
from ._client import AutoContextClient
from ._errors import InvalidExport, SessionNotFound
from ._exports import build_document, parse_document
from ._sessions import SessionInfo
from ._store import lifecycle
from ._store.catalog import Catalog


def _catalog(database_url: str | URL | None, tenant: str | None, *, upgrade: bool) -> Catalog:
    client = AutoContextClient.shared(database_url, auto_upgrade=upgrade)
    return Catalog(client.engine, tenant)


def export_session(
    session_id: str, database_url: str | URL | None = None, *, tenant: str | None = None
) -> dict[str, Any]:
    """The export document of a session (format ``autoctx-export/2``, JSON values only):
    every row of it, read in one consistent view. With `tenant`, a session of another tenant
    is unknown (`SessionNotFound`)."""
    _arguments.session_id(session_id)
    catalog = _catalog(database_url, _arguments.tenant(tenant), upgrade=False)
    rows = lifecycle.read_rows(catalog, session_id, tenant)
    if rows is None:
        raise SessionNotFound(
            f"session {session_id!r} does not exist in this database; list the sessions with "
            "`autoctx sessions` (and check the database URL)"
        )
    return build_document(rows)


def import_session(
    document: Mapping[str, Any] | str | bytes, database_url: str | URL | None = None
) -> SessionInfo:
    """Recreate the session an export document holds (a dict, or its JSON text), with every
    message, the working context, offloads, lineage, events and fork origin as they were, in
    one transaction; returns the new session row.

    The session keeps its id and tenant (under database tenancy, connect as a role granted
    that tenant). Raises `SessionExists` if the id is taken (nothing is overwritten) and
    `InvalidExport` for a document this version cannot restore; nothing is written then.
    """
    if isinstance(document, str | bytes):
        document = _json_document(document)
    rows = parse_document(document)
    sid = _arguments.session_id(rows.session["session_id"])
    tenant = _arguments.tenant(rows.session["tenant"])
    catalog = _catalog(database_url, tenant, upgrade=True)
    info = lifecycle.write_rows(catalog, rows)
    assert info.session_id == sid
    return info


def _json_document(text: str | bytes) -> Any:
    """The JSON of an export's text; `InvalidExport` (which quotes none of it) otherwise."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidExport(
                f"export document: the file is not UTF-8 text (byte {exc.start} is not); "
                "`autoctx export` writes UTF-8: export the session again; nothing was imported"
            ) from None
    try:
        return json.loads(text)
    except RecursionError:
        raise InvalidExport(
            "export document: the JSON is nested deeper than Python can read; an export is "
            "never that deep; nothing was imported"
        ) from None
    except ValueError:
        raise InvalidExport("export document: the text is not JSON; nothing was imported") from None


def purge_sessions(
    older_than: str | timedelta,
    database_url: str | URL | None = None,
    *,
    tenant: str | None = None,
    dry_run: bool = False,
    now: datetime | None = None,
) -> list[SessionInfo]:
    """Delete every session last updated more than `older_than` ago (``30d``, ``12h``,
    ``1d12h`` or a timedelta), with everything of it; of `tenant` only, when given, else of
    every tenant. With `dry_run`, delete nothing and return what would go. Returns the
    sessions, oldest first. Forks own their rows: a fork of a purged session stays."""
    age = _arguments.duration(older_than)
    catalog = _catalog(database_url, _arguments.tenant(tenant), upgrade=False)
    cutoff = (now or datetime.now(UTC)) - age
    return catalog.purge(cutoff, tenant=tenant, dry_run=dry_run)
