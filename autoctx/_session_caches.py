"""What the adapters of a client's memories cache of their sessions' committed content, one
cache per session, the least recently used dropped past a bound (docs/design.md §5). A client
holds one (`AutoContextClient.session_caches`); a memory reaches it through its client.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")


class SessionCaches:
    """The session caches of one client's adapters, least recently used dropped beyond
    `capacity` sessions: a process that serves many sessions keeps the busy ones' content.

    A cache is made by the adapter that asks first (`get(key, make)`) and is the adapter's own
    to keep consistent (it checks the session's epoch on each read, docs/design.md §5); the
    client only holds it, so that every adapter object of a session in the process shares it,
    and drops them all on `close()` and in a forked child.
    """

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._caches: OrderedDict[Hashable, object] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        """The cache of `key` (the adapter's kind and the session), made by `make` if none."""
        with self._lock:
            cache = self._caches.get(key)
            if cache is None:
                cache = make()
                self._caches[key] = cache
                while len(self._caches) > self.capacity:
                    self._caches.popitem(last=False)
            else:
                self._caches.move_to_end(key)
            return cache  # type: ignore[return-value]

    def clear(self) -> None:
        with self._lock:
            self._caches.clear()

    def after_fork_in_child(self) -> None:
        # A lock another thread held at the fork would stay held; the parent's caches are
        # dropped with it (cheap to refill, and nothing of them is the child's to trust).
        self._lock = threading.Lock()
        self._caches = OrderedDict()
