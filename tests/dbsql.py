"""Read-only SQL against a memory's database, for assertions (the library has no raw-SQL door).

With a tenant, the query runs in that tenant's application scope (the `autoctx.tenant` setting,
local to the transaction), so it sees what the memory's own statements see.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from autoctx import AutoContextMemory


def sql(mem: AutoContextMemory, statement: str, **params: Any) -> list[sa.Row[Any]]:
    with mem.engine.connect() as conn:
        if mem.tenant is not None:
            conn.execute(
                sa.text("select set_config('autoctx.tenant', :t, true)"), {"t": mem.tenant}
            )
        return list(conn.execute(sa.text(statement), params))


def handle_of(mem: AutoContextMemory, offload_uuid: Any) -> int:
    """The handle of one of the memory's offloads (the number its tag shows)."""
    rows = sql(
        mem,
        "select handle from offloads where session_id = :s and uuid = :u",
        s=mem.session_id,
        u=offload_uuid,
    )
    assert len(rows) == 1, f"no offload {offload_uuid} in {mem.session_id}"
    return int(rows[0].handle)


def offload_of_summaries(mem: AutoContextMemory) -> dict[int, Any]:
    """The offload of what each message a compression wrote replaced, by that message's id: the
    offload whose first message that message's lineage row of the same event names (one per
    range; a masking pass, one event, has one per output)."""
    return {
        r.summary: r.uuid
        for r in sql(
            mem,
            "select l.summary_id as summary, o.uuid from offloads o join lineage l "
            "on l.session_id = o.session_id and l.event_id = o.event_id "
            "and l.replaced_id = o.message_ids[1] where o.session_id = :s",
            s=mem.session_id,
        )
    }
