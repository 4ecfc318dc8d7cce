"""Every per-session or per-process cache has a bound, least recently used dropped first
(docs/design.md §5). A long-lived process that serves many sessions, or one very long one,
must not grow without limit; bench/memory_soak.py measures the process, these check the rules.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from autoctx import AutoContextClient, OfflineSummarizer
from autoctx._session_caches import SessionCaches

if TYPE_CHECKING:
    pass


def test_the_clients_session_caches_drop_the_least_recently_used_session() -> None:
    caches = SessionCaches(capacity=3)
    made = {k: caches.get(k, dict) for k in ("a", "b", "c")}
    assert caches.get("a", dict) is made["a"]  # used: now the most recent
    caches.get("d", dict)
    assert caches.get("a", dict) is made["a"] and caches.get("c", dict) is made["c"]
    assert caches.get("b", dict) is not made["b"]  # dropped, made again


def test_one_long_sdk_session_keeps_its_items_cache_and_ledger_under_their_bounds(
    client: AutoContextClient, session_id: str, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autoctx.integrations import openai_agents
    from autoctx.integrations.openai_agents import AutoContextSession

    monkeypatch.setattr(openai_agents._ItemCache, "capacity", 20)
    monkeypatch.setattr(openai_agents._Ledger, "capacity", 30)
    session = AutoContextSession(
        session_id, summarizer=OfflineSummarizer(), compress=False, client=client
    )
    shared = openai_agents._item_cache(session.memory())
    loop = asyncio.new_event_loop()
    sizes: list[tuple[int, int]] = []
    for n in range(60):
        items: list[Any] = [
            {"role": "user", "content": f"question {n}"},
            {"type": "message", "role": "assistant", "content": f"answer {n}"},
        ]
        session.add_items_sync(items)
        latest = loop.run_until_complete(session.get_items(4))
        assert [i["content"] for i in latest][-2:] == [f"question {n}", f"answer {n}"]
        sizes.append((len(shared.items), len(session._ledger._known)))
    assert max(s[0] for s in sizes) <= 20 and max(s[1] for s in sizes) <= 30, sizes
    # A whole read past the bound is still whole and right: the dropped messages are fetched.
    whole = loop.run_until_complete(session.get_items())
    loop.close()
    assert len(whole) == 120
    assert len(shared.items) <= 20
    with AutoContextClient(db_url) as other:
        fresh = AutoContextSession(session_id, compress=False, client=other)
        assert fresh.get_items_sync() == whole
    # The most recent messages are the ones kept.
    assert sorted(shared.items)[-1] == max(shared.items) == 120
