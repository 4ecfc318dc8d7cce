"""The schema comes from the Alembic migrations only: upgrade paths, locking, the wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import threading
import uuid
import venv
import warnings
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.engine import URL

from autoctx import AutoContextMemory, Msg, SchemaError
from autoctx._store import tables
from autoctx._store.database import (
    alembic_config,
    create_engine,
    current_revision,
    ensure_database,
    head_revision,
    normalize_url,
    upgrade,
)

ROOT = Path(__file__).resolve().parents[1]


def test_opening_a_memory_on_an_empty_database_upgrades_it(empty_db_url: str) -> None:
    mem = AutoContextMemory.open("first", empty_db_url)
    mem.add(Msg.user("hello"))
    assert current_revision(mem.engine) == head_revision()


def test_auto_upgrade_off_refuses_with_the_fix(empty_db_url: str) -> None:
    with pytest.raises(SchemaError, match="autoctx db upgrade"):
        AutoContextMemory.open("s", empty_db_url, auto_upgrade=False)


def test_concurrent_upgrades_serialize_on_the_advisory_lock(empty_db_url: str) -> None:
    engines = [create_engine(normalize_url(empty_db_url), poolclass=sa.NullPool) for _ in range(4)]
    errors: list[BaseException] = []

    def run(engine: sa.Engine) -> None:
        try:
            upgrade(engine)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert current_revision(engines[0]) == head_revision()
    for e in engines:
        e.dispose()


def test_a_schema_newer_than_the_code_is_refused(empty_db_url: str) -> None:
    engine = create_engine(normalize_url(empty_db_url), poolclass=sa.NullPool)
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("update alembic_version set version_num = '9999_future'"))
    with pytest.raises(SchemaError, match="newer"):
        upgrade(engine)
    engine.dispose()


def _upgrade_in_thread(engine: sa.Engine, seconds: float) -> BaseException | str | None:
    """Run `upgrade` in a thread; what it raised, its revision, or None if it still waits."""
    outcome: list[BaseException | str] = []

    def run() -> None:
        try:
            outcome.append(upgrade(engine))
        except BaseException as exc:  # returned and asserted by the caller
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return outcome[0] if outcome else None


def test_a_failed_migration_surfaces_its_cause_and_releases_the_lock(empty_db_url: str) -> None:
    """Another application's `sessions` table: the upgrade fails with that error (not an
    aborted-transaction one), writes nothing, and the next process is not left waiting for the
    migration lock."""
    engine = create_engine(normalize_url(empty_db_url))  # pooled: the lock must not linger
    with engine.begin() as conn:
        conn.execute(sa.text("create table sessions (id int primary key)"))
    with pytest.raises(SchemaError, match="DuplicateTable") as info:
        upgrade(engine)
    assert "sessions" in str(info.value) and "InFailedSqlTransaction" not in str(info.value)
    assert current_revision(engine) is None  # rolled back whole
    other = create_engine(normalize_url(empty_db_url), poolclass=sa.NullPool)
    again = _upgrade_in_thread(other, 20)
    assert isinstance(again, SchemaError), again  # the same cause, not a hang
    with engine.begin() as conn:
        conn.execute(sa.text("drop table sessions"))
    assert _upgrade_in_thread(other, 60) == head_revision()
    engine.dispose()
    other.dispose()


def test_a_migration_cut_by_a_statement_timeout_leaves_no_lock(empty_db_url: str) -> None:
    url = normalize_url(empty_db_url)
    hurried = create_engine(url, connect_args={"options": "-c statement_timeout=1"})
    outcome = _upgrade_in_thread(hurried, 60)
    assert isinstance(outcome, sa.exc.OperationalError), outcome
    assert "statement timeout" in str(outcome)
    assert _upgrade_in_thread(create_engine(url, poolclass=sa.NullPool), 60) == head_revision()
    hurried.dispose()


def test_another_applications_alembic_history_is_named_as_a_possibility(
    empty_db_url: str,
) -> None:
    engine = create_engine(normalize_url(empty_db_url), poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text("create table alembic_version (version_num varchar(32) primary key)"))
        conn.execute(sa.text("insert into alembic_version values ('ae1027a6acf')"))
    with pytest.raises(SchemaError, match="another application") as info:
        upgrade(engine)
    assert "'ae1027a6acf'" in str(info.value)
    engine.dispose()


def test_processes_creating_one_database_at_once_all_succeed(admin_url: URL) -> None:
    """The embedded server's first start in a fresh directory: several processes create the
    database at the same moment; the ones that lose the race must not fail."""
    name = f"autoctx_race_{uuid.uuid4().hex[:10]}"
    gate = threading.Barrier(6)
    errors: list[BaseException] = []

    def create() -> None:
        gate.wait()
        try:
            ensure_database(admin_url, name)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with engine.connect() as conn:
        found = conn.execute(
            sa.text("select count(*) from pg_database where datname = :n"), {"n": name}
        ).scalar()
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
    engine.dispose()
    assert errors == [] and found == 1, errors


def test_table_descriptions_match_the_migrated_schema(db_url: str) -> None:
    """tables.py is Alembic's target_metadata: autogenerate finds nothing to change between it
    and what the migrations built (columns, types, nullability, server defaults, keys,
    indexes, foreign keys)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    engine = create_engine(normalize_url(db_url), poolclass=sa.NullPool)
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "compare_type": True,
                "compare_server_default": True,
                # Alembic's own table is not autoctx's to describe.
                "include_name": lambda name, kind, parent: name != "alembic_version",
            },
        )
        with warnings.catch_warnings():
            # The generated search column's expression lives in migration 0008 only; Alembic
            # says it cannot compare (or change) a generated column's expression.
            warnings.filterwarnings("ignore", "Computed default on messages.search_tsv")
            diff = compare_metadata(context, [tables.metadata, tables.tenancy_metadata])
    engine.dispose()
    assert diff == [], diff


def test_the_deferred_search_vector_downgrades_and_upgrades_honestly(empty_db_url: str) -> None:
    """Migration 0012: messages appended at head wait for their vector; a downgrade to 0011
    computes every one (the generated column again) and an upgrade keeps them, with the
    trigger that computes a rewritten row's vector and the index of the waiting ones."""
    engine = create_engine(normalize_url(empty_db_url), poolclass=sa.NullPool)

    def vectors(session_id: str) -> list[str | None]:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("select search_tsv::text from messages where session_id = :s order by id"),
                {"s": session_id},
            )
            return [r[0] for r in rows]

    def migrate(revision: str) -> None:
        with engine.connect() as conn:
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)
            conn.commit()

    try:
        upgrade(engine)
        mem = AutoContextMemory.open("vectors", empty_db_url)
        mem.add([Msg.user("the osprey-3301 circles"), Msg.assistant("and the wren-2201 sings")])
        assert vectors("vectors") == [None, None]
        mem.close()
        migrate("0012")  # the revision before the deferred vector
        assert current_revision(engine) == "0012"
        computed = vectors("vectors")
        assert all(v is not None for v in computed) and "'osprey'" in str(computed[0])
        upgrade(engine)
        assert vectors("vectors") == computed, "the upgrade keeps the vectors"
        with engine.begin() as conn:
            waiting = conn.execute(
                sa.text("select pg_get_indexdef('messages_unindexed_idx'::regclass)")
            ).scalar_one()
            conn.execute(
                sa.text(
                    'update messages set content = \'[{"type": "text", "text": '
                    "\"[erased]\"}]' where session_id = 'vectors' and id = 1"
                )
            )
            # Any update recomputes the vector: the function gives what 0011's column gave.
            conn.execute(sa.text("update messages set search_tsv = null where id = 2"))
        assert "search_tsv IS NULL" in waiting
        assert vectors("vectors") == ["'erased':1", computed[1]], "the trigger rewrote it"
        again = AutoContextMemory.open("vectors", empty_db_url)
        assert again.search("osprey-3301") == []
        assert [h.message_id for h in again.search("wren-2201")] == [2]
        again.close()
    finally:
        engine.dispose()


def test_the_reasoning_search_upgrades_old_sessions_and_downgrades_to_the_old_vector(
    empty_db_url: str,
) -> None:
    """Migration 0018: an original holding a thinking block, written while the vector read no
    reasoning, is found by its reasoning after the upgrade; the downgrade gives back 0010's
    function, word for word, and that original's vector without the reasoning."""
    engine = create_engine(normalize_url(empty_db_url), poolclass=sa.NullPool)
    thinking = '[{"type": "opaque", "data": {"type": "thinking", "thinking": "plover-8808"}}]'

    def migrate(revision: str) -> None:
        with engine.connect() as conn:
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)
            conn.commit()

    def read(statement: str) -> str:
        with engine.connect() as conn:
            return str(conn.execute(sa.text(statement)).scalar_one())

    body = (
        "select pg_get_function_sqlbody('autoctx_search_vector(jsonb, text, text)'::regprocedure)"
    )
    vector = "select search_tsv::text from messages where session_id = 'old' and id = 2"
    try:
        upgrade(engine)
        mem = AutoContextMemory.open("old", empty_db_url)
        mem.add([Msg.user("hello"), Msg.assistant("thinking")])
        mem.close()
        migrate("0017")
        before = read(body)
        with engine.begin() as conn:  # written as a 0017 store writes it, vector computed
            conn.execute(
                sa.text(
                    "update messages set content = cast(:c as jsonb) "
                    "where session_id = 'old' and id = 2"
                ),
                {"c": thinking},
            )
        assert "plover" not in read(vector)
        upgrade(engine)
        assert "plover" in read(vector)
        again = AutoContextMemory.open("old", empty_db_url)
        assert [h.message_id for h in again.search('"plover-8808"')] == [2]
        again.close()
        migrate("0017")
        assert read(body) == before
        assert "plover" not in read(vector)
    finally:
        engine.dispose()


def test_message_json_is_compressed_with_lz4_where_the_server_has_it(empty_db_url: str) -> None:
    """Migration 0019: a server with lz4 compresses new content and metadata with it (and still
    reads the values pglz wrote before); the downgrade gives the columns back their default.
    A server without lz4 keeps pglz."""
    engine = create_engine(normalize_url(empty_db_url), poolclass=sa.NullPool)
    big = "tool output line with some words 0123456789\n" * 200  # over TOAST's 2 KB

    def read(statement: str) -> list[object]:
        with engine.connect() as conn:
            return list(conn.execute(sa.text(statement)).scalars())

    compression = (
        "select attcompression::text from pg_attribute where attrelid = 'messages'::regclass "
        "and attname in ('content', 'metadata') order by attname"
    )
    methods = (
        "select pg_column_compression(content) from messages where session_id = 's' order by id"
    )
    try:
        upgrade(engine)
        has_lz4 = read(
            "select 'lz4' = any(enumvals) from pg_settings where name = 'default_toast_compression'"
        ) == [True]
        mem = AutoContextMemory.open("s", empty_db_url)
        mem.add(Msg.user("hello"))
        mem.close()
        with engine.connect() as conn:
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0018")
            conn.commit()
        assert read(compression) == ["", ""]
        with engine.begin() as conn:  # written as a 0018 store writes it
            conn.execute(
                sa.text(
                    "update messages set content = jsonb_build_array(jsonb_build_object("
                    "'type', 'text', 'text', cast(:t as text))) where session_id = 's'"
                ),
                {"t": big},
            )
        upgrade(engine)
        assert read(compression) == (["l", "l"] if has_lz4 else ["", ""])
        again = AutoContextMemory.open("s", empty_db_url)
        again.add(Msg.assistant(big))
        assert [m.text for m in again.messages()] == [big, big]
        again.close()
        assert read(methods) == (["pglz", "lz4"] if has_lz4 else ["pglz", "pglz"])
        with engine.connect() as conn:
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0018")
            conn.commit()
        assert read(compression) == ["", ""]
    finally:
        engine.dispose()


def test_every_key_and_index_of_session_tables_leads_with_session_id(db_url: str) -> None:
    engine = create_engine(normalize_url(db_url), poolclass=sa.NullPool)
    inspector = sa.inspect(engine)
    for table in tables.metadata.sorted_tables:
        pk = inspector.get_pk_constraint(table.name)["constrained_columns"]
        assert pk[0] == "session_id", (table.name, pk)
        for index in inspector.get_indexes(table.name):
            assert index["column_names"][0] == "session_id", (table.name, index)
        for unique in inspector.get_unique_constraints(table.name):
            assert unique["column_names"][0] == "session_id", (table.name, unique)
    engine.dispose()


@pytest.mark.slow
def test_the_built_wheel_carries_the_migrations(tmp_path: Path, empty_db_url: str) -> None:
    """A plain (non-editable) install of the wheel in a fresh venv runs `autoctx db upgrade`.

    The venv gets the wheel alone (`--no-deps`) and finds its dependencies in this test
    environment's site-packages, appended to its path by a `.pth` file (a `.pth` file of that
    directory, this checkout's editable install among them, is not read): installing them again
    was most of the suite's longest test. `pip check` still holds the wheel's declared
    dependencies against what the venv sees, and the venv imports autoctx from the wheel."""
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
    )
    wheel = next(dist.glob("autoctx_pg-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    here = dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib"))
    (Path(purelib) / "borrowed_dependencies.pth").write_text("\n".join(here) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    subprocess.run([*pip, "install", "--quiet", "--no-deps", str(wheel)], check=True)
    subprocess.run([*pip, "check"], check=True, capture_output=True)
    where = subprocess.run(
        [str(python), "-c", "import autoctx; print(autoctx.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    ).stdout.strip()
    assert Path(where).is_relative_to(env_dir), where
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(env_dir / "bin" / "autoctx"), "db", "upgrade", "--database-url", empty_db_url],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert head_revision() in out.stdout
    engine = create_engine(normalize_url(empty_db_url), poolclass=sa.NullPool)
    assert current_revision(engine) == head_revision()
    engine.dispose()
