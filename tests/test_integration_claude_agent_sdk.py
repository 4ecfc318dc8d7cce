"""The Claude Agent SDK: `AutoContextSessionStore` against the SDK's own conformance harness
(`claude_agent_sdk.testing.run_session_store_conformance`, every contract, none skipped), and
the transcript mapping: entries kept losslessly, compact boundaries recorded as events with
lineage, the working context bounded as the CLI's compactions leave it. The SDK's runtime (the
`claude` CLI) is not run: the store is what autoctx provides, and the SDK's store-reading
helpers (`get_session_messages_from_store`, `list_sessions_from_store`) read it back."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from autoctx import AutoContextClient, ConfigError, InvalidArgument

from . import framework_runs
from .agent_model import tool_output

if TYPE_CHECKING:
    from claude_agent_sdk import (
        SessionKey,
    )

    from autoctx.integrations.claude_agent_sdk import AutoContextSessionStore


def test_the_sdks_conformance_harness_passes_every_contract(db_url: str, session_id: str) -> None:
    from claude_agent_sdk.testing import run_session_store_conformance

    from autoctx.integrations.claude_agent_sdk import AutoContextSessionStore

    stores: list[AutoContextSessionStore] = []
    names = itertools.count()

    def make_store() -> AutoContextSessionStore:
        # A namespace per store: the harness wants each contract isolated from the others.
        store = AutoContextSessionStore(db_url, namespace=f"{session_id}-{next(names)}-")
        stores.append(store)
        return store

    async def run() -> None:
        await run_session_store_conformance(make_store)
        for store in stores:
            await store.close()

    asyncio.run(run())
    # Every optional method is implemented, so no contract was skipped: one store per contract
    # (the probe, 1-6, 7-8, 14, 9-11, 12-13).
    assert len(stores) >= 14


_DIRECTORY = "/home/ann/app"
_SID = "0c6f4a2e-8f1d-4c1e-9a7b-2d3e4f5a6b7c"


def _user(uuid: str, text: str, parent: str | None = None) -> dict[str, Any]:
    return {
        "type": "user",
        "uuid": uuid,
        "parentUuid": parent,
        "sessionId": "s",
        "timestamp": "2026-01-01T00:00:00.000Z",
        "message": {"role": "user", "content": text},
    }


def _call(uuid: str, parent: str, call_id: str) -> dict[str, Any]:
    return {
        "type": "assistant",
        "uuid": uuid,
        "parentUuid": parent,
        "sessionId": "s",
        "timestamp": "2026-01-01T00:00:01.000Z",
        "message": {
            "role": "assistant",
            "id": f"msg_{uuid}",
            "content": [
                {"type": "text", "text": "Running the step."},
                {"type": "tool_use", "id": call_id, "name": "run_step", "input": {"n": 1}},
            ],
        },
    }


def _result(uuid: str, parent: str, call_id: str, output: str) -> dict[str, Any]:
    return {
        "type": "user",
        "uuid": uuid,
        "parentUuid": parent,
        "sessionId": "s",
        "timestamp": "2026-01-01T00:00:02.000Z",
        "message": {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call_id, "content": output}],
        },
    }


def _transcript(steps: int) -> list[dict[str, Any]]:
    entries = [_user("u0", "Run the steps.")]
    for n in range(1, steps + 1):
        entries.append(_call(f"a{n}", entries[-1]["uuid"], f"toolu_{n}"))
        size = framework_runs.output_size(n)
        entries.append(_result(f"r{n}", f"a{n}", f"toolu_{n}", tool_output(n, size)))
    return entries


def test_a_transcript_round_trips_and_a_compact_boundary_is_an_event_with_lineage(
    db_url: str, session_id: str
) -> None:
    from claude_agent_sdk import (
        get_session_messages_from_store,
        list_sessions_from_store,
        project_key_for_directory,
    )

    from autoctx.integrations.claude_agent_sdk import AutoContextSessionStore

    key: SessionKey = {"project_key": project_key_for_directory(_DIRECTORY), "session_id": _SID}
    first = _transcript(6)
    boundary = {
        "type": "system",
        "subtype": "compact_boundary",
        "uuid": "b1",
        "parentUuid": None,
        "logicalParentUuid": first[-1]["uuid"],
        "content": "Conversation compacted",
        "compactMetadata": {"trigger": "auto", "preTokens": 52_000},
        "timestamp": "2026-01-01T00:10:00.000Z",
    }
    summary = _user("u-sum", "Summary: steps 1-6 ran; FACT-0003 matters.", "b1")
    summary["isCompactSummary"] = True
    later = [_call("a7", "u-sum", "toolu_7"), _result("r7", "a7", "toolu_7", tool_output(7, 900))]

    async def run() -> None:
        store = AutoContextSessionStore(db_url, namespace=f"{session_id}-")
        await store.append(key, first[:5])
        await store.append(key, first[3:])  # a retried batch: uuids already held are skipped
        await store.append(key, [boundary, summary, *later])
        # Lossless: what went in comes out, in order, each entry once.
        assert await store.load(key) == [*first, boundary, summary, *later]
        memory = await store.memory(key)
        # The boundary is an event whose offload holds what the compaction replaced.
        events = await memory.events()
        assert len(events) == 1 and events[0].reason == "clear"
        replaced = await memory.reload(events[0].offload_uuid, originals=True)
        assert [m.metadata["claude"]["uuid"] for m in replaced] == [e["uuid"] for e in first]
        # The working context goes on from the boundary, as the CLI's does.
        working = await memory.messages()
        assert [m.metadata["claude"]["uuid"] for m in working] == ["b1", "u-sum", "a7", "r7"]
        hits = await memory.search('"FACT-0005"')
        assert hits, "a compacted entry is no longer found"
        # The SDK's own readers of a store read it.
        messages = await get_session_messages_from_store(store, _SID, directory=_DIRECTORY)
        assert messages
        listed = await list_sessions_from_store(store, directory=_DIRECTORY)
        assert [s.session_id for s in listed] == [_SID]
        await store.close()

    asyncio.run(run())


def test_bad_keys_and_entries_are_refused_and_write_nothing(
    db_url: str, session_id: str, client: AutoContextClient
) -> None:
    from autoctx.integrations.claude_agent_sdk import AutoContextSessionStore

    async def run() -> None:
        store = AutoContextSessionStore(db_url, namespace=f"{session_id}-")
        good: SessionKey = {"project_key": "p", "session_id": "s"}
        with pytest.raises(InvalidArgument, match="project_key must be a non-empty string"):
            await store.append({"project_key": "", "session_id": "s"}, [{"type": "x"}])
        with pytest.raises(InvalidArgument, match="session_id must be a non-empty string"):
            await store.load({"project_key": "p", "session_id": 3})  # type: ignore[typeddict-item]
        with pytest.raises(InvalidArgument, match="must be a JSON object"):
            await store.append(good, [{"type": "x"}, "not an entry"])  # type: ignore[list-item]
        assert await store.load(good) is None
        await store.close()

    asyncio.run(run())
    with pytest.raises(ConfigError, match="not both"):
        AutoContextSessionStore(db_url, client=client)
    with pytest.raises(ConfigError, match="namespace must be a string"):
        AutoContextSessionStore(db_url, namespace=None)  # type: ignore[arg-type]


def test_without_the_sdk_the_import_error_names_the_extra() -> None:
    message = framework_runs.import_error_without(
        "autoctx.integrations.claude_agent_sdk", "claude_agent_sdk"
    )
    assert "needs the Claude Agent SDK" in message
    framework_runs.assert_names_the_extra(message, "claude-agent-sdk")


def test_the_example_runs(db_url: str) -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "claude_agent_sdk_store.py"
    out = subprocess.run(
        [sys.executable, str(example), "--database-url", db_url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "compact boundary: event 1 (clear), 2 entries behind it" in out.stdout
