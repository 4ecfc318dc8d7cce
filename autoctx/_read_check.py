"""A read of the working context that is over the window (docs/design.md §2, "no silent
overflow"): `to_openai()` and `to_anthropic()` hand the model what they read, so a context that
nobody compressed would be sent whole. Said once per memory in a warning naming
`compress_if_needed()`; a strict memory (`RuntimeOptions(strict=True)`) raises instead."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from ._config import AutoContextConfig, RuntimeOptions
from ._errors import ContextOverWindow
from ._messages import Msg

logger = logging.getLogger("autoctx")


class ReadCheck:
    """One memory's check of what it hands out for a model call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._warned = False

    def check(
        self,
        msgs: Sequence[Msg],
        config: AutoContextConfig,
        options: RuntimeOptions,
        session_id: str,
    ) -> None:
        tokens = sum(m.tokens or 0 for m in msgs)
        window = config.message_window
        if tokens < window:
            return
        reserved = (
            f" (max_tokens less reserve_tokens {config.reserve_tokens:,})"
            if (config.reserve_tokens)
            else ""
        )
        detail = (
            f"session {session_id!r}: the working context holds {tokens:,} tokens, at or over "
            f"the window of {window:,}{reserved}; call compress_if_needed() after add() and "
            "before reading it for a model call (or open the memory with background=True)"
        )
        if options.strict:
            raise ContextOverWindow(detail)
        with self._lock:
            if self._warned:
                return
            self._warned = True
        logger.warning("autoctx: %s (logged once per memory)", detail)
