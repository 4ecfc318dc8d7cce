"""Opening a memory: the session row read or created, the config in force (the caller's,
else the stored one, with the stored model and search configuration), the store, the
summarizer, and the memory built on them. What `AutoContextClient.open` calls; its own module,
so that the memory's own module holds the memory only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from . import _reserve
from ._config import (
    AutoContextConfig,
    config_argument,
    config_changes,
    options_argument,
    stored_config,
)
from ._errors import (
    SessionNotFound,
)
from ._memory import AutoContextMemory, MemoryClient
from ._observe import CompressionHooks
from ._open_arguments import OpenArguments
from ._search import (
    NOT_INDEXED,
    SEARCH_CONFIGS,
    stored_search_config,
)
from ._sessions import SessionInfo
from ._store.rows import search_config_of
from ._store.store import SessionStore
from ._summarizers import (
    default_summarizer,
    describe_summarizer,
)
from ._tokens import TokenCounter

logger = logging.getLogger("autoctx")


def open_memory(
    client: MemoryClient,
    args: OpenArguments,
    *,
    hooks: Sequence[CompressionHooks] = (),
    log_level: int = logging.INFO,
) -> AutoContextMemory:
    """`AutoContextMemory.open` through `client` (what `AutoContextClient.open` calls), with
    `hooks` (the client's and the caller's, checked); `log_level`: the level of the line
    naming the memory's summarizer."""
    args.check()
    session_id, summarizer = args.session_id, args.summarizer
    checked = options_argument(args.options)
    given = config = config_argument(args.config)
    config = config or AutoContextConfig()
    store = SessionStore(client.engine, session_id, args.tenant)
    info = store.get_session()
    if info is None:
        if not args.create:
            raise SessionNotFound(
                f"session {session_id!r} does not exist; open it with create=True to start it"
            )
        counter = TokenCounter(config.model)
        info = store.create_session(config=config, encoding=counter.encoding_name)
    elif given is None:
        # Reopening without a config keeps the thresholds the session was run with (read
        # back from the database: checked, an InvalidStoredConfig naming the session if not).
        config = stored_config(session_id, info.config)
    if info.model != config.model:
        config = _with_model(config, info)
    indexed = _indexed_with(info)
    if indexed is not None and stored_search_config(config.search_config) != indexed:
        config = _with_search_config(config, info)
    if given is not None:
        config = _reserve.kept_measure(config, info.config)
    if config.to_json() != info.config:
        # The thresholds in force are recorded on the session (and on each event): the latest
        # open wins, and says what it changed (docs/design.md §8).
        changes = config_changes(info.config, config)
        if changes:
            logger.warning(
                "autoctx: session %r: the config given to open changes the recorded one "
                "(%s); it is recorded and used from now on (open without config= to keep the "
                "recorded one)",
                session_id,
                ", ".join(changes),
            )
        store.set_config(config.to_json())
    chosen = summarizer if summarizer is not None else default_summarizer()
    logger.log(
        log_level,
        "autoctx: session %r: %s",
        session_id,
        describe_summarizer(chosen, given=summarizer is not None),
    )
    return AutoContextMemory(
        store,
        info,
        config,
        chosen,
        owns_summarizer=summarizer is None,  # one it made itself, it closes
        client=client,
        background=args.background,
        hooks=hooks,
        options=checked,
    )


def _with_model(config: AutoContextConfig, info: SessionInfo) -> AutoContextConfig:
    # The encoding is fixed at creation: counts already stored were made with it.
    logger.warning(
        "autoctx: session %r was created for model %r; keeping it (config says %r)",
        info.session_id,
        info.model,
        config.model,
    )
    return replace(config, model=info.model)


def _indexed_with(info: SessionInfo) -> str | None:
    """The search configuration the session's recorded config names, None when that cannot be
    read (a config given to `open` then records its own, which repairs it)."""
    if not isinstance(info.config, Mapping):
        return None
    indexed = search_config_of(info.config)
    return indexed if indexed == NOT_INDEXED or indexed in SEARCH_CONFIGS else None


def _with_search_config(config: AutoContextConfig, info: SessionInfo) -> AutoContextConfig:
    # The session's originals are indexed with the configuration it was created with: a search
    # with another would miss them.
    indexed = search_config_of(info.config)
    stored = None if indexed == NOT_INDEXED else indexed
    logger.warning(
        "autoctx: session %r indexes its messages with search_config %r; keeping it (config "
        "says %r)",
        info.session_id,
        stored,
        config.search_config,
    )
    return replace(config, search_config=stored)
