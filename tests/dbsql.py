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
