"""The reads and writes that span sessions: listing, looking a session up, retention.

A `Catalog` is bound to no session and keeps no cache: it is what the CLI, the console and the
operations (`autoctx purge`) use to find sessions, where a `SessionStore` works on one. The
other readers across sessions take it as their scope: full-text search over a tenant
(`autoctx._store.search`), the console's pages (`autoctx._store.console`), export and import
(`autoctx._store.lifecycle.read_rows`, `write_rows`). Due sessions for the workers are claims
(`autoctx._store.claims`), which hold a lock, not a read.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa

from .rows import SessionInfo, session_info
from .scope import TenantScope
from .sql import PURGE_SESSIONS
from .tables import sessions


class Catalog(TenantScope):
    """The sessions of a database (of one tenant's, with row-level security, when `tenant` is
    given), read and deleted across sessions."""

    def session(self, session_id: str, tenant: str | None = None) -> SessionInfo | None:
        """The session row, or None for an unknown id (or, with `tenant`, another tenant's
        session). Binds nothing: open a memory to work on the session."""
        cond = sessions.c.session_id == session_id
        if tenant is not None:
            cond = sa.and_(cond, sessions.c.tenant == tenant)
        with self.statement() as conn:
            row = conn.execute(sa.select(sessions).where(cond)).one_or_none()
        return None if row is None else session_info(row)

    def list_sessions(
        self, tenant: str | None = None, prefix: str | None = None
    ) -> list[SessionInfo]:
        """The sessions (of `tenant`, whose ids start with `prefix`, when given), the most
        recently updated first."""
        stmt = sa.select(sessions).order_by(sessions.c.updated_at.desc())
        if tenant is not None:
            stmt = stmt.where(sessions.c.tenant == tenant)
        if prefix:
            stmt = stmt.where(sessions.c.session_id.startswith(prefix, autoescape=True))
        with self.statement() as conn:
            return [session_info(r) for r in conn.execute(stmt)]

    def purge(self, before: datetime, *, tenant: str | None, dry_run: bool) -> list[SessionInfo]:
        """The sessions last updated before `before` (of `tenant` only, when given), deleted
        with everything of them unless `dry_run`; oldest first. One statement: a session
        written to while it runs is judged on its new `updated_at`, and kept."""
        with self.transaction() as conn:
            if dry_run:
                cond = sessions.c.updated_at < before
                if tenant is not None:
                    cond = sa.and_(cond, sessions.c.tenant == tenant)
                rows = conn.execute(sa.select(sessions).where(cond)).all()
            else:
                params = {"before": before, "tenant": tenant}
                rows = conn.exec_driver_sql(PURGE_SESSIONS, params).all()
            found = [session_info(r) for r in rows]
        return sorted(found, key=lambda s: (s.updated_at, s.session_id))
