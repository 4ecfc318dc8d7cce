"""The session row of one session: what binds a store to one incarnation of its id.

`SessionRow` is a `TenantScope` bound to one session id and the incarnation it first sees: it
reads, creates, locks and updates the `sessions` row, and gives every statement on the
session's other rows its guard (`alive_condition`, `row_condition`). `SessionStore` (the units
of work of the agent loop) is one; the SQL modules that serve a store (the undo's, the
lifecycle's) take one, and so need not import the store.
"""

from __future__ import annotations

import uuid as uuid_mod
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, Row

from .._config import AutoContextConfig
from .._errors import SessionNotFound
from .rows import SessionInfo, session_info
from .scope import TenantScope
from .tables import sessions

_INSUFFICIENT_PRIVILEGE = "42501"


def session_gone(session_id: str) -> SessionNotFound:
    return SessionNotFound(
        f"session {session_id!r} does not exist any more (it was deleted, and the id may have "
        "been created again since); open the session again to work on what now has that id"
    )


class SessionRow(TenantScope):
    """One session's row, for the incarnation this scope first sees (see the module docstring)."""

    def __init__(self, engine: Engine, session_id: str, tenant: str | None = None) -> None:
        super().__init__(engine, tenant)
        self.session_id = session_id
        #: The incarnation of the id this store works on (see the module docstring); None until
        #: the first read of the session row binds it.
        self._incarnation: uuid_mod.UUID | None = None

    def get_session(self) -> SessionInfo | None:
        """The session row, or None for an unknown id (or another tenant's session). The first
        row seen binds the store to its incarnation; a later one of another incarnation raises
        `SessionNotFound`."""
        cond = sessions.c.session_id == self.session_id
        if self.tenant is not None:
            cond = sa.and_(cond, sessions.c.tenant == self.tenant)
        with self.statement() as conn:
            row = conn.execute(sa.select(sessions).where(cond)).one_or_none()
        if row is None:
            if self._incarnation is not None:
                raise session_gone(self.session_id)
            return None
        return self._bind(session_info(row))

    def _bind(self, info: SessionInfo) -> SessionInfo:
        assert info.incarnation is not None
        if self._incarnation is None:
            self._incarnation = info.incarnation
        elif self._incarnation != info.incarnation:
            raise session_gone(self.session_id)
        return info

    def incarnation(self) -> uuid_mod.UUID:
        """The incarnation this store works on (read once if not yet seen)."""
        if self._incarnation is not None:
            return self._incarnation
        info = self.get_session()
        if info is None or info.incarnation is None:
            raise SessionNotFound(f"session {self.session_id!r} does not exist")
        return info.incarnation

    def alive_condition(self) -> Any:
        """The condition a Core statement on the session's rows carries: still its
        incarnation."""
        return sa.exists().where(
            sessions.c.session_id == self.session_id,
            sessions.c.incarnation == self.incarnation(),
        )

    def check_alive(self, conn: Connection) -> None:
        """Tell an empty result from a session that is gone (an empty read is rare: this costs
        nothing on the usual path)."""
        if not conn.execute(sa.select(self.alive_condition())).scalar_one():
            raise session_gone(self.session_id)

    @property
    def subject(self) -> str:
        return f"session {self.session_id!r}"

    def row_condition(self) -> Any:
        """The session row of the incarnation this store works on."""
        return sa.and_(
            sessions.c.session_id == self.session_id,
            sessions.c.incarnation == self.incarnation(),
        )

    def lock_row(self, conn: Connection) -> Row[Any]:
        """Lock the session row in `conn`'s transaction (every writer of the session does,
        docs/design.md §5) and return it; `SessionNotFound` when the session is gone."""
        row = conn.execute(
            sa.select(sessions).where(self.row_condition()).with_for_update()
        ).one_or_none()
        if row is None:
            raise session_gone(self.session_id)
        return row

    def create_session(self, *, config: AutoContextConfig, encoding: str) -> SessionInfo:
        """Create the session unless it exists; returns the row either way."""
        tenant = self.tenant
        stmt = (
            sa.dialects.postgresql.insert(sessions)
            .values(
                session_id=self.session_id,
                tenant=tenant,
                model=config.model,
                encoding=encoding,
                config=config.to_json(),
            )
            .on_conflict_do_nothing(index_elements=["session_id"])
        )
        try:
            with self.transaction() as conn:
                conn.execute(stmt)
                row = conn.execute(
                    sa.select(sessions).where(sessions.c.session_id == self.session_id)
                ).one_or_none()
        except sa.exc.ProgrammingError as exc:
            if getattr(exc.orig, "sqlstate", None) != _INSUFFICIENT_PRIVILEGE:
                raise
            # Database tenancy: the policies refused a session of a tenant this role is not
            # granted (or one without a tenant).
            raise SessionNotFound(
                f"session {self.session_id!r} cannot be created for tenant {tenant!r}: this "
                "database role is not granted that tenant; the tables' owner grants it with "
                "`autoctx db grant-tenant ROLE TENANT`"
            ) from None
        # None: the id is taken by a session that row-level security hides from this role
        # (another tenant's), so the insert did nothing and the row cannot be read back.
        info = None if row is None else session_info(row)
        if info is None or (tenant is not None and info.tenant != tenant):
            # Another tenant's session must look exactly like an unknown one; ids are global,
            # so this id cannot be created either.
            raise SessionNotFound(
                f"session {self.session_id!r} does not exist for tenant {tenant!r} and the id "
                "is not available; choose another session id"
            )
        return self._bind(info)

    def _update_session(self, **values: Any) -> None:
        with self.statement() as conn:
            result = conn.execute(sa.update(sessions).where(self.row_condition()).values(values))
        if not result.rowcount:
            raise session_gone(self.session_id)

    def set_plan(self, plan: Mapping[str, Any] | None) -> None:
        plan_value = dict(plan) if plan is not None else sa.null()
        self._update_session(plan=plan_value, updated_at=sa.func.now())

    def set_config(self, config: Mapping[str, Any]) -> None:
        """Record the thresholds now in force for the session."""
        self._update_session(config=dict(config), updated_at=sa.func.now())

    def settle(self, version: int) -> None:
        """Remember that compression at `version` could not reach its target (docs/design.md §2)."""
        with self.statement() as conn:
            conn.execute(
                sa.update(sessions)
                .where(self.row_condition(), sessions.c.version == version)
                .values(settled_version=version)
            )
