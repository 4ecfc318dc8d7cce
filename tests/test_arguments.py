"""One check per kind of argument: each bad value gets the same error class and the same
message through every public entry point that takes it (the memory, sync and async, the client,
the operations, the integrations, the worker, the CLI and the model tools), before anything is
written. The expected class is spelled out per kind; the expected message is the one check's.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from typer.testing import CliRunner

import autoctx
from autoctx import (
    AsyncAutoContextMemory,
    AutoContextClient,
    AutoContextMemory,
    InvalidDuration,
    InvalidErasure,
    InvalidMessageId,
    InvalidOffloadId,
    InvalidPage,
    InvalidSessionId,
    InvalidTenant,
    Msg,
    OfflineSummarizer,
    TenantGrantError,
)
from autoctx import _arguments as checks
from autoctx._cli import app
from autoctx._worker import AutoContextWorker

if TYPE_CHECKING:
    from autoctx.integrations.langchain import AutoContextMiddleware
    from autoctx.integrations.openai_agents import AutoContextSession
    from autoctx.integrations.pydantic_ai import AutoContextCapability

#: A value too long to be quoted in a message: a message that repeats it fails the test.
LONG = "conversation-text-" * 20

BAD_SESSION_IDS: dict[str, object] = {
    "empty": "",
    "over_255": LONG,
    "nul": "agent\x00-42",
    "lone_surrogate": "agent\udc80-42",
    "not_a_string": 42,
    "bytes": b"agent-42",
}
BAD_TENANTS: dict[str, object] = {
    "empty": "",
    "blank": "   ",
    "over_255": LONG,
    "nul": "acme\x00",
    "lone_surrogate": "acme\udc80",
    "not_a_string": 42,
}
BAD_MESSAGE_IDS: dict[str, object] = {
    "a_string": "1",
    "a_float": 1.0,
    "a_bool": True,
    "zero": 0,
    "negative": -3,
    "over_bigint": 2**63,
}
BAD_OFFLOAD_IDS: dict[str, object] = {
    "sql": "00000000-0000-0000-0000-000000000000' OR '1'='1",
    "words": LONG,
    "braced": "{123e4567-e89b-12d3-a456-426614174000}",
    "empty": "",
    "not_a_string": 5.0,
    "zero_handle": 0,
    "negative_handle": "-3",
}
BAD_PAGES: dict[str, tuple[object, object]] = {
    "negative_offset": (-1, None),
    "bool_offset": (True, None),
    "string_offset": (LONG, None),
    "zero_limit": (0, 0),
    "float_limit": (0, 1.5),
}
BAD_REASONS: dict[str, object] = {
    "empty": "",
    "blank": "  \n ",
    "not_a_string": 7,
    "over_1000": "x" * 1001,
    "nul": "user\x00request",
    "lone_surrogate": "user\ud800request",
}
BAD_DURATIONS: dict[str, object] = {
    "no_unit": "30",
    "minutes_or_months": "15m",
    "words": "a month ago",
    "zero": timedelta(0),
    "negative": timedelta(days=-1),
    "over_the_longest": "999999999d",
    "not_a_string": 30,
}
BAD_ROLES: dict[str, object] = {
    "empty": "",
    "predefined": "pg_monitor",
    "over_63_bytes": "r" * 64,
    "nul": "agent\x00",
    "lone_surrogate": "agent\udc80",
}


def _expected(check: Callable[[], object]) -> Exception:
    """The error the one check raises for a value."""
    try:
        check()
    except autoctx.AutoContextError as exc:
        return exc
    raise AssertionError("the check accepted a bad value")


def _assert_same(call: Callable[[], object], expected: Exception, value: object) -> None:
    with pytest.raises(type(expected)) as info:
        call()
    assert type(info.value) is type(expected)
    assert str(info.value) == str(expected)
    # A long value (it may be conversation text) is never repeated.
    assert LONG not in str(info.value)


def _one_line(message: str) -> str:
    """An error message as the CLI prints it: on one line, runs of white space as one."""
    return " ".join(message.split())


def _cli(*args: str) -> str:
    """The one error line of a CLI command that must fail."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("autoctx: error: "), result.stderr
    return lines[0].removeprefix("autoctx: error: ").strip()


def _tool(mem: AutoContextMemory, name: str, arguments: dict[str, Any]) -> str:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return mem.handle_tool_call(call)


def _in_async(
    db_url: str, sid: str, use: Callable[[AsyncAutoContextMemory], Awaitable[object]]
) -> Any:
    async def run() -> object:
        amem = await AsyncAutoContextMemory.open(sid, db_url, summarizer=OfflineSummarizer())
        try:
            return await use(amem)
        finally:
            await amem.close()

    return asyncio.run(run())


@pytest.fixture(scope="module")
def client(db_url: str) -> Iterator[AutoContextClient]:
    with AutoContextClient(db_url) as client:
        yield client


@pytest.fixture(scope="module")
def mem(client: AutoContextClient) -> AutoContextMemory:
    """A session with two messages; no test may change it."""
    mem = client.open(f"args-{uuid.uuid4().hex[:8]}", summarizer=OfflineSummarizer())
    mem.add([Msg.user("secret words"), Msg.assistant("more secret words")])
    return mem


@pytest.fixture
def unchanged(mem: AutoContextMemory) -> Iterator[None]:
    before = [(m.id, m.text) for m in mem.messages()]
    yield
    assert [(m.id, m.text) for m in mem.messages()] == before


# -- session ids ----------------------------------------------------------------------------


# The integrations' entry points, imported when a test calls them (each imports its framework).


def _sdk_session(*args: Any, **kw: Any) -> AutoContextSession:
    from autoctx.integrations.openai_agents import AutoContextSession

    return AutoContextSession(*args, **kw)


def _langchain_middleware(*args: Any, **kw: Any) -> AutoContextMiddleware:
    from autoctx.integrations.langchain import AutoContextMiddleware

    return AutoContextMiddleware(*args, **kw)


def _pydantic_ai_capability(**kw: Any) -> AutoContextCapability:
    from autoctx.integrations.pydantic_ai import AutoContextCapability

    return AutoContextCapability(**kw)


SESSION_ID_ENTRIES: dict[
    str, Callable[[Any, str, AutoContextClient, AutoContextMemory], object]
] = {
    "AutoContextMemory.open": lambda v, url, c, m: AutoContextMemory.open(v, url),
    "AsyncAutoContextMemory.open": lambda v, url, c, m: asyncio.run(
        AsyncAutoContextMemory.open(v, url)
    ),
    "AutoContextClient.open": lambda v, url, c, m: c.open(v),
    "fork": lambda v, url, c, m: m.fork(v),
    "reload(session_id=)": lambda v, url, c, m: m.reload(message_id=1, session_id=v),
    "export_session": lambda v, url, c, m: autoctx.export_session(v, url),
    "AutoContextSession": lambda v, url, c, m: _sdk_session(v, url),
    "AutoContextMiddleware": lambda v, url, c, m: _langchain_middleware(url, session_id=v),
    "AutoContextCapability": lambda v, url, c, m: _pydantic_ai_capability(
        session_id=v, database_url=url
    ),
}


@pytest.mark.parametrize("entry", sorted(SESSION_ID_ENTRIES))
@pytest.mark.parametrize("kind", sorted(BAD_SESSION_IDS))
@pytest.mark.usefixtures("unchanged")
def test_a_bad_session_id_is_refused_alike_everywhere(
    kind: str, entry: str, db_url: str, client: AutoContextClient, mem: AutoContextMemory
) -> None:
    value = BAD_SESSION_IDS[kind]
    expected = _expected(lambda: checks.session_id(value))
    assert type(expected) is InvalidSessionId
    _assert_same(lambda: SESSION_ID_ENTRIES[entry](value, db_url, client, mem), expected, value)


@pytest.mark.parametrize("kind", sorted(k for k in BAD_SESSION_IDS if k != "bytes"))
def test_a_bad_session_id_is_refused_alike_by_the_cli_and_the_tools(
    kind: str, db_url: str, mem: AutoContextMemory
) -> None:
    value = BAD_SESSION_IDS[kind]
    expected = str(_expected(lambda: checks.session_id(value)))
    answer = _tool(mem, "context_reload", {"message_id": 1, "session_id": value})
    assert answer == f"Invalid session_id: {expected}."
    if isinstance(value, str):
        for args in (["show", value], ["export", value], ["fork", mem.session_id, value]):
            assert _cli(*args, "--database-url", db_url) == _one_line(expected), args


# -- tenants --------------------------------------------------------------------------------


TENANT_ENTRIES: dict[str, Callable[[Any, str, AutoContextClient], object]] = {
    "AutoContextMemory.open": lambda v, url, c: AutoContextMemory.open("s", url, tenant=v),
    "AsyncAutoContextMemory.open": lambda v, url, c: asyncio.run(
        AsyncAutoContextMemory.open("s", url, tenant=v)
    ),
    "AutoContextClient.open": lambda v, url, c: c.open("s", tenant=v),
    "export_session": lambda v, url, c: autoctx.export_session("s", url, tenant=v),
    "purge_sessions": lambda v, url, c: autoctx.purge_sessions("30d", url, tenant=v),
    "grant_tenant": lambda v, url, c: autoctx.grant_tenant("some_role", v, url),
    "revoke_tenant": lambda v, url, c: autoctx.revoke_tenant("some_role", v, url),
    "AutoContextWorker": lambda v, url, c: AutoContextWorker(url, tenant=v),
    "AutoContextSession": lambda v, url, c: _sdk_session("s", url, tenant=v),
    "AutoContextMiddleware": lambda v, url, c: _langchain_middleware(url, tenant=v),
    "AutoContextCapability": lambda v, url, c: _pydantic_ai_capability(
        session_id="s", database_url=url, tenant=v
    ),
}


@pytest.mark.parametrize("entry", sorted(TENANT_ENTRIES))
@pytest.mark.parametrize("kind", sorted(BAD_TENANTS))
def test_a_bad_tenant_is_refused_alike_everywhere(
    kind: str, entry: str, db_url: str, client: AutoContextClient
) -> None:
    value = BAD_TENANTS[kind]
    expected = _expected(lambda: checks.tenant(value))
    assert type(expected) is InvalidTenant
    _assert_same(lambda: TENANT_ENTRIES[entry](value, db_url, client), expected, value)
    # Code written before the class existed caught these.
    with pytest.raises(InvalidSessionId):
        TENANT_ENTRIES[entry](value, db_url, client)
    with pytest.raises(TenantGrantError):
        TENANT_ENTRIES[entry](value, db_url, client)


@pytest.mark.parametrize("kind", sorted(k for k, v in BAD_TENANTS.items() if isinstance(v, str)))
def test_a_bad_tenant_is_refused_alike_by_every_command(kind: str, db_url: str) -> None:
    value = BAD_TENANTS[kind]
    assert isinstance(value, str)
    expected = str(_expected(lambda: checks.tenant(value)))
    for args in (
        ["sessions", "--tenant", value],
        ["search", "deploy", "--tenant", value],
        ["purge", "--older-than", "30d", "--dry-run", "--tenant", value],
        ["erase", "s", "1", "--reason", "a test", "--tenant", value],
        ["db", "grant-tenant", "some_role", value],
    ):
        assert _cli(*args, "--database-url", db_url) == _one_line(expected), args


def test_a_tenant_none_is_no_tenant_but_a_grant_needs_one(db_url: str) -> None:
    assert checks.tenant(None) is None
    for grant in (autoctx.grant_tenant, autoctx.revoke_tenant):
        with pytest.raises(InvalidTenant, match="a grant names a tenant"):
            grant("some_role", None, db_url)  # type: ignore[arg-type]


# -- message ids ----------------------------------------------------------------------------


#: Each entry with the name it gives the argument in its message.
MESSAGE_ID_ENTRIES: dict[str, tuple[str, Callable[[Any, AutoContextMemory, str], object]]] = {
    "reload": ("message_id", lambda v, m, url: m.reload(message_id=v)),
    "fork": ("at_message", lambda v, m, url: m.fork(f"{m.session_id}-f", at_message=v)),
    "erase": ("each of message_ids", lambda v, m, url: m.erase([v], reason="a test")),
    "async reload": (
        "message_id",
        lambda v, m, url: _in_async(url, m.session_id, lambda a: a.reload(message_id=v)),
    ),
    "async erase": (
        "each of message_ids",
        lambda v, m, url: _in_async(url, m.session_id, lambda a: a.erase([v], reason="a test")),
    ),
}


@pytest.mark.parametrize("entry", sorted(MESSAGE_ID_ENTRIES))
@pytest.mark.parametrize("kind", sorted(BAD_MESSAGE_IDS))
@pytest.mark.usefixtures("unchanged")
def test_a_bad_message_id_is_refused_alike_everywhere(
    kind: str, entry: str, mem: AutoContextMemory, db_url: str
) -> None:
    value = BAD_MESSAGE_IDS[kind]
    what, call = MESSAGE_ID_ENTRIES[entry]
    expected = _expected(lambda: checks.message_id(value, what))
    assert type(expected) is InvalidMessageId
    _assert_same(lambda: call(value, mem, db_url), expected, value)


@pytest.mark.parametrize("kind", sorted(BAD_MESSAGE_IDS))
def test_the_reload_tool_refuses_the_message_ids_reload_refuses(
    kind: str, mem: AutoContextMemory
) -> None:
    answer = _tool(mem, "context_reload", {"message_id": BAD_MESSAGE_IDS[kind]})
    assert answer.startswith("Invalid message_id"), answer
    good = _tool(mem, "context_reload", {"message_id": mem.messages()[0].id})
    assert "secret words" in good


# -- offload ids and pages ------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(BAD_OFFLOAD_IDS))
@pytest.mark.usefixtures("unchanged")
def test_a_bad_offload_id_is_refused_alike_everywhere(
    kind: str, mem: AutoContextMemory, db_url: str
) -> None:
    value = BAD_OFFLOAD_IDS[kind]
    expected = _expected(lambda: checks.offload_id(value))
    assert type(expected) is InvalidOffloadId
    _assert_same(lambda: mem.reload(value), expected, value)  # type: ignore[arg-type]
    _assert_same(
        lambda: _in_async(db_url, mem.session_id, lambda a: a.reload(value)),  # type: ignore[arg-type]
        expected,
        value,
    )
    if isinstance(value, str) and value.strip():
        answer = _tool(mem, "context_reload", {"uuid": value})
        assert answer == f"Invalid uuid: {expected}"


@pytest.mark.parametrize("kind", sorted(BAD_PAGES))
def test_a_bad_page_is_refused_alike_by_both_memories(
    kind: str, mem: AutoContextMemory, db_url: str
) -> None:
    offset, limit = BAD_PAGES[kind]
    expected = _expected(lambda: checks.page(offset, limit))
    assert type(expected) is InvalidPage
    offload = str(uuid.uuid4())
    _assert_same(lambda: mem.reload(offload, offset=offset, limit=limit), expected, offset)  # type: ignore[arg-type]
    _assert_same(
        lambda: _in_async(
            db_url,
            mem.session_id,
            lambda a: a.reload(offload, offset=offset, limit=limit),  # type: ignore[arg-type]
        ),
        expected,
        offset,
    )


# -- erasures, ages, roles ------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(BAD_REASONS))
@pytest.mark.usefixtures("unchanged")
def test_a_bad_erasure_reason_is_refused_alike_everywhere(
    kind: str, mem: AutoContextMemory, db_url: str
) -> None:
    value = BAD_REASONS[kind]
    expected = _expected(lambda: checks.reason(value))
    assert type(expected) is InvalidErasure
    first = mem.messages()[0].id
    assert first is not None
    _assert_same(lambda: mem.erase([first], reason=value), expected, value)  # type: ignore[arg-type]
    _assert_same(
        lambda: _in_async(db_url, mem.session_id, lambda a: a.erase([first], reason=value)),  # type: ignore[arg-type]
        expected,
        value,
    )
    if isinstance(value, str) and "\x00" not in value:
        args = ["erase", mem.session_id, str(first), "--reason", value, "--database-url", db_url]
        assert _cli(*args) == _one_line(str(expected))


@pytest.mark.parametrize("kind", sorted(BAD_DURATIONS))
def test_a_bad_retention_age_is_refused_alike_everywhere(kind: str, db_url: str) -> None:
    value = BAD_DURATIONS[kind]
    expected = _expected(lambda: checks.duration(value))
    assert type(expected) is InvalidDuration
    _assert_same(lambda: autoctx.purge_sessions(value, db_url), expected, value)  # type: ignore[arg-type]
    if isinstance(value, str):
        args = ["purge", "--older-than", value, "--dry-run", "--database-url", db_url]
        assert _cli(*args) == _one_line(str(expected))


@pytest.mark.parametrize("kind", sorted(BAD_ROLES))
def test_a_bad_role_is_refused_alike_by_grant_and_revoke(kind: str, db_url: str) -> None:
    value = BAD_ROLES[kind]
    expected = _expected(lambda: checks.role(value))
    assert type(expected) is TenantGrantError
    _assert_same(lambda: autoctx.grant_tenant(value, "acme", db_url), expected, value)  # type: ignore[arg-type]
    _assert_same(lambda: autoctx.revoke_tenant(value, "acme", db_url), expected, value)  # type: ignore[arg-type]


# -- text PostgreSQL cannot store -----------------------------------------------------------


@pytest.mark.parametrize("text", ["a\x00b", "a\ud800b", "\udfff"])
def test_unstorable_text_is_named_alike_in_messages_plans_searches_and_names(
    text: str, mem: AutoContextMemory
) -> None:
    problem = checks.unstorable(text)
    assert problem is not None
    calls: list[tuple[type[Exception], Callable[[], object]]] = [
        (autoctx.InvalidMessage, lambda: mem.add(Msg.user(text))),
        (autoctx.InvalidPlan, lambda: mem.set_plan({"goal": text, "steps": []})),
        (autoctx.InvalidSearch, lambda: mem.search(text)),
        (InvalidSessionId, lambda: mem.fork(text)),
        (InvalidErasure, lambda: mem.erase([1], reason=text)),
    ]
    for error, call in calls:
        with pytest.raises(error) as info:
            call()
        assert problem in str(info.value), (error, str(info.value))
    assert checks.unstorable("plain text, ünïcödé and emoji 🎉") is None
