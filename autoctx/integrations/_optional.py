"""The optional import of a framework: each integration needs its framework, which comes with
an extra of the distribution; without it, importing the integration says which extra to
install instead of naming a module the user never asked for."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def missing_extra_message(integration: str, needs: str, extra: str) -> str:
    """What importing an integration says when its framework is not installed."""
    return (
        f"autoctx's {integration} integration needs {needs}, which is not installed: install "
        f'the extra with `pip install "autoctx-pg[{extra}]"` (in a checkout: '
        f'`pip install -e ".[{extra}]"`)'
    )


@contextlib.contextmanager
def framework_of(
    integration: str, *, needs: str, extra: str, packages: tuple[str, ...]
) -> Iterator[None]:
    """Import the framework inside this block: a `ModuleNotFoundError` for one of its top-level
    `packages` becomes one naming `extra` (and the missing module, as `name`); any other
    error, a missing dependency of autoctx itself included, passes through unchanged."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in packages:
            raise
        message = missing_extra_message(integration, needs, extra)
        raise ModuleNotFoundError(message, name=exc.name) from None
