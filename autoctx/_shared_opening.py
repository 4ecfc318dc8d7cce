"""How `AutoContextMemory.open` and `AsyncAutoContextMemory.open` reach the process's shared
client for a URL (`AutoContextClient.shared`), without importing it.

The client is above the memory: it makes memories (`AutoContextClient.open`), so the memory's
modules do not import it (docs/design.md §2, no import circles). The opening through the shared
client is installed here by the package, `autoctx/__init__.py`, which Python runs before any of
its modules: so it is in place whichever of them a program imports first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from ._open_arguments import OpenArguments

T = TypeVar("T")

#: Opens a memory through the process's shared client for a URL: (database_url, auto_upgrade,
#: the open's arguments) -> the memory.
OpenShared = Callable[["str | URL | None", bool, "OpenArguments"], object]

_opening: list[OpenShared] = []


def install(opening: OpenShared) -> None:
    """Set the opening through the shared client (the package does, once, as it loads)."""
    _opening[:] = [opening]


def open_shared(
    database_url: str | URL | None, auto_upgrade: bool, args: OpenArguments, kind: type[T]
) -> T:
    """The memory `args` name, opened through the process's shared client for `database_url`
    (made on first use, its schema checked, upgraded when `auto_upgrade`); a `kind`."""
    if not _opening:
        raise RuntimeError(
            "autoctx is not fully loaded (the opening through the shared client is installed "
            "by `import autoctx`): import autoctx, or open the memory through an "
            "AutoContextClient"
        )
    mem = _opening[0](database_url, auto_upgrade, args)
    if not isinstance(mem, kind):
        raise TypeError(f"the shared client opened a {type(mem).__name__}, not a {kind.__name__}")
    return mem
