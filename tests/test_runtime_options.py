"""The config split (docs/design.md §8): `AutoContextConfig` is what a session stores (its
thresholds, model, prompts, search configuration), `RuntimeOptions` how one process runs a
compression (passes, summarizer calls, deadlines, concurrency, strictness), and `auto_upgrade`
the client's. An old keyword says where it went; a session stored before the split still
opens."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from autoctx import (
    AsyncAutoContextMemory,
    AutoContextClient,
    AutoContextConfig,
    AutoContextMemory,
    ConfigError,
    OfflineSummarizer,
    RuntimeOptions,
)
from autoctx._config import MOVED_FIELDS
from autoctx._worker import AutoContextWorker
from tests.dbsql import sql
from tests.histories import SMALL, multi_round

Open = Callable[..., AutoContextMemory]

#: What each moved keyword's error names as its new place.
NEW_PLACE = {
    "max_passes": "options=RuntimeOptions(max_passes=...)",
    "max_llm_calls": "options=RuntimeOptions(max_llm_calls=...)",
    "summarizer_deadline_s": "options=RuntimeOptions(summarizer_deadline_s=...)",
    "compress_deadline_s": "options=RuntimeOptions(compress_deadline_s=...)",
    "summarizer_concurrency": "options=RuntimeOptions(summarizer_concurrency=...)",
    "strict": "options=RuntimeOptions(strict=...)",
    "auto_upgrade": "pass auto_upgrade=... to AutoContextMemory.open or AutoContextClient",
}
#: A value each moved field once took.
OLD_VALUES = {
    "max_passes": 1,
    "max_llm_calls": 0,
    "summarizer_deadline_s": 5.0,
    "compress_deadline_s": 7.5,
    "summarizer_concurrency": 1,
    "strict": True,
    "auto_upgrade": False,
}


def test_the_moved_fields_are_the_runtime_options_and_the_clients_upgrade() -> None:
    assert set(MOVED_FIELDS) == set(NEW_PLACE) == set(OLD_VALUES)
    assert {f.name for f in dataclasses.fields(RuntimeOptions)} == set(NEW_PLACE) - {"auto_upgrade"}
    assert not set(MOVED_FIELDS) & {f.name for f in dataclasses.fields(AutoContextConfig)}


@pytest.mark.parametrize("name", sorted(NEW_PLACE))
def test_an_old_keyword_says_where_it_moved(name: str) -> None:
    for build in (
        lambda: AutoContextConfig(**{name: OLD_VALUES[name]}),
        lambda: dataclasses.replace(AutoContextConfig(), **{name: OLD_VALUES[name]}),
    ):
        with pytest.raises(ConfigError) as info:
            build()
        message = str(info.value)
        assert message.startswith(f"AutoContextConfig.{name} moved to ")
        assert NEW_PLACE[name] in message
        assert "did you mean" not in message


def test_runtime_options_are_validated_naming_the_field() -> None:
    for name, bad in (
        ("max_passes", 0),
        ("max_llm_calls", -1),
        ("summarizer_concurrency", True),
        ("summarizer_deadline_s", float("nan")),
        ("compress_deadline_s", 0),
        ("strict", "yes"),
    ):
        with pytest.raises(ConfigError, match=rf"^RuntimeOptions\.{name} must be"):
            RuntimeOptions(**{name: bad})
    defaults = RuntimeOptions()
    assert (defaults.max_passes, defaults.max_llm_calls, defaults.summarizer_concurrency) == (
        10,
        8,
        4,
    )
    assert defaults.strict is False


def test_options_must_be_runtime_options(open_memory: Open) -> None:
    for bad in ({"max_passes": 1}, AutoContextConfig(), 3):
        with pytest.raises(ConfigError, match="options must be a RuntimeOptions or None"):
            open_memory(options=bad)


def test_options_are_the_memorys_and_its_forks_and_never_stored(open_memory: Open) -> None:
    options = RuntimeOptions(max_passes=1, strict=True, compress_deadline_s=42.0)
    # A low target: one pass cannot reach it, so only max_passes ends the call early.
    deep = dataclasses.replace(SMALL, target_ratio=0.2)
    mem = open_memory(config=deep, options=options)
    assert mem.options is options
    mem.add(multi_round(15, rounds=6, steps=8))
    events = [e for e in mem.compress_if_needed() if e.status == "applied"]
    # One pass (max_passes=1): one strategy applied, however far the target is.
    assert events and len({e.strategy for e in events}) == 1
    (stored,) = sql(mem, "select config from sessions where session_id = :s", s=mem.session_id)
    assert not set(MOVED_FIELDS) & set(stored[0])
    assert stored[0] == deep.to_json()
    child = mem.fork(f"{mem.session_id}-child")
    assert child.options is options
    # Reopened without options: the defaults, whatever another process ran it with.
    assert open_memory(mem.session_id).options == RuntimeOptions()


def test_a_session_stored_before_the_split_still_opens(db_url: str, open_memory: Open) -> None:
    mem = open_memory(config=SMALL)
    mem.close()
    legacy = {**SMALL.to_json(), **OLD_VALUES}
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.execute(
            sa.text("update sessions set config = cast(:c as jsonb) where session_id = :s"),
            {"c": json.dumps(legacy), "s": mem.session_id},
        )
    engine.dispose()
    again = open_memory(mem.session_id, create=False)
    # The thresholds it recorded; the runtime values it carried are this process's now.
    assert again.config == SMALL
    assert again.options == RuntimeOptions()
    (stored,) = sql(again, "select config from sessions where session_id = :s", s=mem.session_id)
    assert stored[0] == SMALL.to_json(), "the record is rewritten without the moved keys"
    again.add(multi_round(15, rounds=6, steps=8))
    assert any(e.status == "applied" for e in again.compress_if_needed())


def test_the_client_the_async_memory_and_the_worker_take_options(db_url: str) -> None:
    import asyncio

    options = RuntimeOptions(max_llm_calls=0)
    sid = f"opts-{uuid.uuid4().hex[:8]}"
    with AutoContextClient(db_url, auto_upgrade=False) as client:
        mem = client.open(sid, SMALL, options=options, summarizer=OfflineSummarizer())
        assert mem.options is options

    async def run() -> RuntimeOptions:
        amem = await AsyncAutoContextMemory.open(sid, db_url, options=options)
        try:
            return amem.sync.options
        finally:
            await amem.close()

    assert asyncio.run(run()) is options
    with AutoContextWorker(db_url, summarizer=OfflineSummarizer(), options=options) as worker:
        assert worker.options is options
    with pytest.raises(ConfigError, match="options must be a RuntimeOptions"):
        AutoContextWorker(db_url, options={"strict": True})  # type: ignore[arg-type]


def test_an_export_made_before_the_split_still_imports(open_memory: Open, db_url: str) -> None:
    from autoctx import InvalidExport, export_session, import_session

    mem = open_memory(config=SMALL)
    mem.add(multi_round(15, rounds=6, steps=8))
    mem.compress_if_needed()
    document = export_session(mem.session_id, db_url)
    before = [(m.id, m.role, m.text) for m in mem.messages()]
    mem.delete()
    legacy = json.loads(json.dumps(document))
    legacy["session"]["config"] = {**legacy["session"]["config"], **OLD_VALUES}
    # Each former field is still checked: a value it never took is refused, naming it.
    for name, bad in (("max_passes", 0), ("strict", "yes"), ("auto_upgrade", 1)):
        broken = json.loads(json.dumps(legacy))
        broken["session"]["config"][name] = bad
        with pytest.raises(InvalidExport, match=rf"session\.config\.{name} "):
            import_session(broken, db_url)
    info = import_session(legacy, db_url)
    again = open_memory(info.session_id, create=False)
    assert again.config == SMALL and again.options == RuntimeOptions()
    assert [(m.id, m.role, m.text) for m in again.messages()] == before
