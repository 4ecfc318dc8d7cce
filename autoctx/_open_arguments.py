"""The arguments every way of opening a memory takes past where to connect, as one value: the
client's `open`, the memories' `open` (through the shared client) and their async twins'.
A leaf, so that the memory and the client both speak it without importing each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import _arguments
from ._background import validate_background
from ._config import config_argument, options_argument
from ._observe import CompressionHooks, hooks_of

if TYPE_CHECKING:
    from ._background import BackgroundMode
    from ._config import AutoContextConfig, RuntimeOptions
    from ._summarizers import Summarizer


@dataclass(frozen=True, slots=True)
class OpenArguments:
    """The arguments every `open` takes past where to connect (the client's, the memories',
    their async twins'), in their order. Each `open` keeps its own explicit signature, which
    its users read, and hands them on as this one value."""

    session_id: str
    config: AutoContextConfig | None
    options: RuntimeOptions | None
    tenant: str | None
    summarizer: Summarizer | None
    create: bool
    background: BackgroundMode
    hooks: CompressionHooks | Sequence[CompressionHooks] | None

    def check(self) -> None:
        """Raise the error a bad argument gets (each names the argument and the fix)."""
        _arguments.session_id(self.session_id)
        _arguments.tenant(self.tenant)
        validate_background(self.background)
        config_argument(self.config)
        options_argument(self.options)
        hooks_of(self.hooks)
