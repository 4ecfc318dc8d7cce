"""The model tools of a memory: `context_reload` (get offloaded context back, or one message of a
search hit) and `context_search` (find what the agent knew, in this session or in every session
of its tenant).

The handlers answer in plain text and turn every error into a plain answer, so a model's bad
call never raises into the agent loop. They never leave the memory's tenant: a reload by uuid
alone sees the offloads of the memory's own session; with a `session_id`, and a search of scope
"tenant", the sessions of its tenant (the untenanted ones for an untenanted memory).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._arguments import OffloadRef
from ._arguments import message_id as checked_message_id
from ._arguments import offload_id as checked_offload_id
from ._arguments import session_id as checked_session_id
from ._config import AutoContextConfig
from ._errors import (
    InvalidMessageId,
    InvalidOffloadId,
    InvalidSearch,
    InvalidSessionId,
    MessageNotFound,
    OffloadNotFound,
)
from ._messages import Msg, NonJsonNumber, ToolUseBlock, as_openai_dict, json_value
from ._search import (
    SCOPES,
    AutoContextSearchHit,
    SearchScope,
    render_hits,
    validate_limit,
    validate_query,
    validate_scope,
)
from ._transcript import render_transcript

TOOL_NAME = "context_reload"
SEARCH_TOOL_NAME = "context_search"
#: Hits a `context_search` call may ask for (its answer stays under a reload page).
MAX_TOOL_HITS = 10
DEFAULT_TOOL_HITS = 5

NOT_FOUND_ANSWER = "No offloaded context with that id in this session."
MESSAGE_NOT_FOUND_ANSWER = "No message with that id in that session."
#: A reload by handle or uuid, optionally of another session of the tenant, of the messages the
#: offload removed (one level) or, when the last argument is true, of the originals behind them.
ReloadOffload = Callable[[OffloadRef, str | None, bool], list[Msg]]
#: A reload of one message by id, optionally of another session of the tenant.
ReloadMessage = Callable[[int, str | None], Msg]
#: The facts of an offload's originals that the working context lacks (this session only).
DroppedFacts = Callable[[OffloadRef], list[str]]
#: A search: (query, scope, limit) -> hits, best first.
Search = Callable[[str, SearchScope, int], list[AutoContextSearchHit]]


def reload_tool_definition(page_chars: int) -> dict[str, Any]:
    """The OpenAI function-tool definition of `context_reload`."""
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": (
                "Reload context that was compressed to save space. Messages that end with "
                "<!-- offload N --> replace original messages; call this with that number as "
                "offload to read what they replaced (a summary inside keeps its own tag; pass "
                "originals=true to read the raw messages behind every nested summary at once, or "
                "dropped=true to list only the facts of those originals that your context no "
                "longer shows, such as what a summary left out). "
                "To read a message that context_search found, "
                "pass its message_id (and its session_id when it is from another session). "
                "Long results come in pages of about "
                f"{page_chars} characters: call again with the offset the answer gives."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "offload": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "The number N from an <!-- offload N --> tag.",
                    },
                    "uuid": {
                        "type": "string",
                        "description": "Instead of offload: the uuid from an older tag.",
                    },
                    "message_id": {
                        "type": "integer",
                        "minimum": 1,
                        "description": (
                            "Instead of uuid: the message id of a context_search hit, to read "
                            "that one message whole."
                        ),
                    },
                    "session_id": {
                        "type": "string",
                        "description": (
                            "The session of a context_search hit from another session (omit "
                            "it for this session)."
                        ),
                    },
                    "offset": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "Character offset of the page to read (default 0).",
                    },
                    "originals": {
                        "type": "boolean",
                        "description": (
                            "With offload: true answers the original messages behind the offload, "
                            "through every nested summary, instead of what it replaced one "
                            "level down (default false)."
                        ),
                    },
                    "dropped": {
                        "type": "boolean",
                        "description": (
                            "With offload: true answers only the facts (paths, ids, errors, "
                            "values, the user's instructions) of the originals behind the "
                            "offload that the current context does not show (default false)."
                        ),
                    },
                },
                # offload (or uuid) or message_id: a search hit in another session's working
                # context is held by no offload, so an offload id alone cannot reach it
                # (docs/design.md §9).
                "required": [],
                "additionalProperties": False,
            },
        },
    }


def tool_definitions(config: AutoContextConfig) -> list[dict[str, Any]]:
    """The OpenAI function-tool definitions of a memory's model tools, for `config`."""
    return [reload_tool_definition(config.reload_page_chars), search_tool_definition()]


def _arguments(arguments: object, example: str) -> dict[str, Any] | str:
    """A call's arguments as a dict, or the plain answer that says what is wrong with them."""
    if isinstance(arguments, str):
        try:
            args = json_value(arguments)
        except NonJsonNumber:
            return (
                f"Invalid arguments: NaN and Infinity are not JSON; pass {example} "
                "with integer numbers."
            )
        except RecursionError:
            # A hostile nesting depth: Python's json recurses once per level.
            return f"Invalid arguments: nested far too deep; expected JSON like {example}."
        except ValueError:
            return f"Invalid arguments: expected JSON like {example}."
    elif isinstance(arguments, Mapping):
        args = dict(arguments)
    else:
        return (
            "Invalid arguments: expected a JSON object text or a dict like "
            f"{example}, got {type(arguments).__name__}."
        )
    if not isinstance(args, dict):
        return f"Invalid arguments: expected a JSON object like {example}."
    return args


def _session_argument(value: object) -> str | None:
    """The session id a call names (None: the memory's own session); raises
    `InvalidSessionId` for one that cannot be a session id (the answer never repeats it)."""
    return None if value is None else checked_session_id(value)


def answer_reload_call(
    arguments: str | Mapping[str, Any],
    reload: ReloadOffload,
    page_chars: int,
    reload_message: ReloadMessage | None = None,
    dropped: DroppedFacts | None = None,
) -> str:
    """Answer one `context_reload` call with text (never raises for a bad call): the originals
    an offload holds (`offload`, its handle; or `uuid`, as tags written before handles show
    it), or one message of a search hit (`message_id`), of this session or of the
    `session_id` given; with ``dropped: true``, the facts of an offload's originals that the
    working context does not show (docs/design.md §6)."""
    args = _arguments(arguments, '{"offload": 12}')
    if isinstance(args, str):
        return args
    try:
        session = _session_argument(args.get("session_id"))
    except InvalidSessionId as exc:
        return f"Invalid session_id: {exc}."
    handle, raw, message_id = args.get("offload"), args.get("uuid"), args.get("message_id")
    if handle is not None and raw is not None:
        return "Pass either offload (the number in a tag) or uuid (an older tag's), not both."
    name = "offload" if handle is not None else "uuid"
    raw = handle if handle is not None else raw
    if raw is not None and message_id is not None:
        return f"Pass either {name} (an offload) or message_id (one message), not both."
    offset = args.get("offset", 0)
    originals = args.get("originals", False)
    if not isinstance(originals, bool):
        return "Invalid originals: pass true (the raw messages behind the offload) or false."
    if message_id is not None and originals:
        return (
            "originals applies to an offload, not to a message_id: pass the offload number of "
            "a tag instead."
        )
    want_dropped = args.get("dropped", False)
    if not isinstance(want_dropped, bool):
        return "Invalid dropped: pass true (the facts your context lacks) or false."
    if want_dropped and (message_id is not None or session is not None or originals):
        return (
            "dropped applies to an offload of this session alone (no message_id, session_id "
            "or originals)."
        )
    if message_id is not None and reload_message is not None:
        try:
            message_id = checked_message_id(message_id)
        except InvalidMessageId:
            return "Invalid message_id: pass the integer message id of a context_search hit."
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            return "Invalid offset: pass a non-negative integer character offset."
        try:
            msg = reload_message(message_id, session)
        except MessageNotFound:
            return MESSAGE_NOT_FOUND_ANSWER
        return _page(render_transcript([msg], keep_tags=True), offset, page_chars, "message")
    if raw is None:
        return (
            'Missing offload: pass the number of an offload tag as {"offload": 12}, or the '
            'message id of a search hit as {"message_id": 42}.'
        )
    # A handle may come as a number or as text; an older tag's uuid only as text.
    if isinstance(raw, bool) or not isinstance(raw, (int | str) if name == "offload" else str):
        return (
            f"Invalid {name}: it must be {'an integer' if name == 'offload' else 'a string'}, "
            f"got {type(raw).__name__}; copy the "
            f"{'number' if name == 'offload' else 'uuid'} from an offload tag."
        )
    if isinstance(raw, str) and not raw.strip():
        # Answers never spell out the tag: they land in the context, where it would read as an
        # offload tag to the model and to the summary checks.
        return f"Empty {name}: copy the number from an offload tag."
    try:
        offload = checked_offload_id(raw)
    except InvalidOffloadId as exc:
        return f"Invalid {name}: {exc}"
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        return "Invalid offset: pass a non-negative integer character offset."
    if want_dropped and dropped is not None:
        try:
            facts = dropped(offload)
        except OffloadNotFound:
            return NOT_FOUND_ANSWER
        return _page(_render_dropped(facts), offset, page_chars, "answer")
    try:
        msgs = reload(offload, session, originals)
    except OffloadNotFound:
        return NOT_FOUND_ANSWER if session is None else NOT_FOUND_ANSWER.replace("this", "that")
    # Tags stay visible: a reloaded summary points at its own offload, one level further down.
    return _page(render_transcript(msgs, keep_tags=True), offset, page_chars, "offloaded context")


def _render_dropped(facts: list[str]) -> str:
    if not facts:
        return "Your context shows every fact found in the originals behind that offload."
    listed = "\n".join(f"- {f}" for f in facts)
    return (
        f"Facts of the originals behind that offload that your context does not show now:\n"
        f"{listed}\nCall {TOOL_NAME} with that uuid and originals=true to read them in place."
    )


def _page(text: str, offset: int, page_chars: int, what: str) -> str:
    if offset >= len(text) and offset > 0:
        return f"Offset {offset} is past the end: the {what} has {len(text)} characters."
    page = text[offset : offset + page_chars]
    end = offset + len(page)
    if end < len(text):
        return (
            f"{page}\n[page: characters {offset}-{end} of {len(text)}; call {TOOL_NAME} with "
            f"offset={end} for the next page]"
        )
    return page


def search_tool_definition() -> dict[str, Any]:
    """The OpenAI function-tool definition of `context_search`."""
    return {
        "type": "function",
        "function": {
            "name": SEARCH_TOOL_NAME,
            "description": (
                "Search what you knew: the original messages of this conversation, including "
                "those compressed away, or (scope 'tenant') of every earlier session of yours. "
                "Full-text search by words, ids or paths ('deploy failed', 'req-7f3a', "
                "'/srv/app/main.py'; \"quoted phrase\", -word to exclude, or). Answers the "
                "best matches with a short extract each and how to read the whole message "
                f"with {TOOL_NAME}."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {
                        "type": "string",
                        "description": "Words, ids or paths to look for.",
                    },
                    "scope": {
                        "type": "string",
                        "enum": list(SCOPES),
                        "description": (
                            "'session' (default): this conversation; 'tenant': every session "
                            "of yours."
                        ),
                    },
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_TOOL_HITS,
                        "description": f"Best matches to return (default {DEFAULT_TOOL_HITS}).",
                    },
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    }


def answer_search_call(
    arguments: str | Mapping[str, Any],
    search: Search,
    *,
    own_session: str,
    max_chars: int,
) -> str:
    """Answer one `context_search` call with text (never raises for a bad call)."""
    args = _arguments(arguments, '{"query": "..."}')
    if isinstance(args, str):
        return args
    try:
        query = validate_query(args.get("query"))
        scope = validate_scope(args.get("scope", "session"))
        limit = validate_limit(args.get("limit", DEFAULT_TOOL_HITS), MAX_TOOL_HITS)
    except InvalidSearch as exc:
        return f"Invalid search: {exc}."
    hits = search(query, scope, limit)
    return render_hits(hits, scope=scope, own_session=own_session, max_chars=max_chars)


def call_arguments(call: ToolUseBlock | Mapping[str, Any]) -> tuple[str, str | Mapping[str, Any]]:
    """(tool name, arguments) of an OpenAI tool call dict, an Anthropic tool_use block or a
    `ToolUseBlock`; a call of any
    other shape names no tool (the handler then answers that it does not know it)."""
    if isinstance(call, ToolUseBlock):
        return call.name, call.arguments
    call = as_openai_dict(call)  # the `openai` client's tool-call object
    if not isinstance(call, Mapping):
        return "", {}
    fn = call.get("function", call)
    if not isinstance(fn, Mapping):
        return "", {}
    name = fn.get("name", "")
    # Arguments of the wrong type are passed on as they are, for the answer to explain them.
    # An Anthropic tool_use block (or the `anthropic` client's) carries its arguments as 'input'.
    arguments = fn.get("arguments", fn.get("input", "{}"))
    return name if isinstance(name, str) else "", arguments
