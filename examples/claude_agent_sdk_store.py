"""The Claude Agent SDK's transcripts kept in autoctx: `AutoContextSessionStore`.

    python examples/claude_agent_sdk_store.py                  # mirror a transcript, read it back
    python examples/claude_agent_sdk_store.py --query "Fix the failing test"   # needs `claude`

Without `--query` it does what the SDK's runtime does with a store, without the `claude` CLI:
mirrors a transcript (entries as the CLI writes them, a compact boundary among them) with
`append`, reads it back with `load` and with the SDK's own `get_session_messages_from_store`,
and shows what autoctx made of the boundary (an event whose offload holds what the compaction
replaced). With `--query` it runs a real session through `query(...)` with the store set, which
spawns the `claude` CLI (install it, and log in, first).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import uuid

from claude_agent_sdk import (
    ClaudeAgentOptions,
    get_session_messages_from_store,
    project_key_for_directory,
    query,
)

from autoctx.integrations.claude_agent_sdk import AutoContextSessionStore


def transcript(session_id: str) -> list[dict]:
    def user(uuid_: str, text: str, parent: str | None) -> dict:
        message = {"role": "user", "content": text}
        return {
            "type": "user",
            "uuid": uuid_,
            "parentUuid": parent,
            "sessionId": session_id,
            "timestamp": "2026-01-01T00:00:00.000Z",
            "message": message,
        }

    def assistant(uuid_: str, text: str, parent: str) -> dict:
        message = {
            "role": "assistant",
            "id": f"msg_{uuid_}",
            "content": [{"type": "text", "text": text}],
        }
        return {
            "type": "assistant",
            "uuid": uuid_,
            "parentUuid": parent,
            "sessionId": session_id,
            "timestamp": "2026-01-01T00:00:01.000Z",
            "message": message,
        }

    boundary = {
        "type": "system",
        "subtype": "compact_boundary",
        "uuid": "b1",
        "parentUuid": None,
        "logicalParentUuid": "a1",
        "content": "Conversation compacted",
        "timestamp": "2026-01-01T00:05:00.000Z",
    }
    summary = user("u2", "Summary: the test failed on a missing data.csv; it is fixed.", "b1")
    summary["isCompactSummary"] = True
    return [
        user("u1", "Fix the failing test", None),
        assistant("a1", "tests/test_io.py fails: data.csv is missing. Adding it.", "u1"),
        boundary,
        summary,
        assistant("a2", "Done: the suite passes.", "u2"),
    ]


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--query", default=None, help="run a real session (spawns `claude`)")
    args = parser.parse_args()
    store = AutoContextSessionStore(args.database_url)
    if args.query is not None:
        options = ClaudeAgentOptions(session_store=store, cwd=os.getcwd())
        async for message in query(prompt=args.query, options=options):
            print(message)
        await store.close()
        return

    session_id = str(uuid.uuid4())
    directory = os.getcwd()
    key = {"project_key": project_key_for_directory(directory), "session_id": session_id}
    entries = transcript(session_id)
    await store.append(key, entries[:2])
    await store.append(key, entries[2:])
    assert await store.load(key) == entries  # lossless
    messages = await get_session_messages_from_store(store, session_id, directory=directory)
    print(f"{len(messages)} messages read back by the SDK")
    memory = await store.memory(key)
    for event in await memory.events():
        replaced = await memory.reload(event.offload_uuid, originals=True)
        print(
            f"compact boundary: event {event.id} ({event.reason}), "
            f"{len(replaced)} entries behind it"
        )
    print(f"working context: {[m.text[:40] for m in await memory.messages()]}")
    await store.delete(key)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main())
