"""Google ADK: `AutoContextSessionService` against the contract ADK holds its own session
services to, and `AutoContextPlugin` through ADK's real `Runner` with ADK's own `AnthropicLlm`
(the official `anthropic` client) talking to the local Messages API server and its scripted
tool-calling agent, which counts the input of every request.

The contract tests are those of ADK's `tests/unittests/sessions/test_session_service.py` that
take its `session_service` fixture (the behaviour every `BaseSessionService` owes its
callers), ported one for one with their names and assertions; each runs on a service of its
own namespace. What is not ported, and why:

- `test_append_event_to_stale_session` and
  `test_append_event_concurrent_stale_sessions_reject_stale_writer` (run on ADK's
  `DatabaseSessionService` only, not in the shared contract): autoctx has no revision check
  on an append, so a stale session object's event is kept after the newer one (the module
  docstring of `autoctx.integrations.adk` says so);
- the tests of one backend's internals (`DatabaseSessionService`'s engine options, rollback
  spies, `prepare_tables`, app/user state rows and row locks; `SqliteSessionService`'s URLs;
  `InMemorySessionService`'s storage object): they test that code, not the contract;
- `test_append_event_when_session_is_same_ref_as_storage_session`: in-memory only (there is
  no storage object to share).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from autoctx import (
    AutoContextClient,
    AutoContextConfig,
    AutoContextMemory,
    ConfigError,
    InvalidArgument,
    OfflineSummarizer,
)

from . import framework_runs
from .agent_model import tool_output
from .anthropic_server import AnthropicAgent, AnthropicServer

if TYPE_CHECKING:
    from google.adk.events.event import Event
    from google.adk.runners import Runner
    from google.adk.sessions.base_session_service import GetSessionConfig
    from google.adk.tools.base_tool import BaseTool
    from google.genai import types

    from autoctx.integrations.adk import AutoContextSessionService

Contract = Callable[["AutoContextSessionService"], Awaitable[None]]
CONTRACTS: list[Contract] = []


def contract(fn: Contract) -> Contract:
    """A contract case (run by `test_adk_session_service_contract`, not collected itself)."""
    CONTRACTS.append(fn)
    fn.__test__ = False  # type: ignore[attr-defined]
    return fn


@pytest.mark.parametrize("case", CONTRACTS, ids=[c.__name__ for c in CONTRACTS])
def test_adk_session_service_contract(case: Contract, db_url: str, session_id: str) -> None:
    from autoctx.integrations.adk import AutoContextSessionService

    async def run() -> None:
        service = AutoContextSessionService(db_url, namespace=f"{session_id}-")
        try:
            await case(service)
        finally:
            await service.close()

    asyncio.run(run())


# --- ADK's contract, ported -------------------------------------------------------------------


@contract
async def test_get_empty_session(session_service: AutoContextSessionService) -> None:
    assert not await session_service.get_session(
        app_name="my_app", user_id="test_user", session_id="123"
    )


@contract
async def test_create_get_session(session_service: AutoContextSessionService) -> None:
    app_name = "my_app"
    user_id = "test_user"
    state = {"key": "value"}
    session = await session_service.create_session(app_name=app_name, user_id=user_id, state=state)
    assert session.app_name == app_name
    assert session.user_id == user_id
    assert session.id
    assert session.state == state
    assert session.last_update_time <= datetime.now().astimezone(UTC).timestamp()
    got_session = await session_service.get_session(
        app_name=app_name, user_id=user_id, session_id=session.id
    )
    assert got_session == session
    assert got_session.last_update_time <= datetime.now().astimezone(UTC).timestamp()
    await session_service.delete_session(app_name=app_name, user_id=user_id, session_id=session.id)
    assert (
        await session_service.get_session(app_name=app_name, user_id=user_id, session_id=session.id)
        is None
    )


@contract
async def test_create_and_list_sessions(session_service: AutoContextSessionService) -> None:
    session_ids = ["session" + str(i) for i in range(5)]
    for sid in session_ids:
        await session_service.create_session(
            app_name="my_app", user_id="test_user", session_id=sid, state={"key": "value" + sid}
        )
    sessions = (
        await session_service.list_sessions(app_name="my_app", user_id="test_user")
    ).sessions
    assert len(sessions) == len(session_ids)
    assert {s.id for s in sessions} == set(session_ids)
    for session in sessions:
        assert session.state == {"key": "value" + session.id}


@contract
async def test_list_sessions_all_users(session_service: AutoContextSessionService) -> None:
    for user, sid in (("user1", "session1a"), ("user1", "session1b"), ("user2", "session2a")):
        await session_service.create_session(
            app_name="my_app", user_id=user, session_id=sid, state={"key": "value" + sid[7:]}
        )
    sessions_1 = (await session_service.list_sessions(app_name="my_app", user_id="user1")).sessions
    assert len(sessions_1) == 2
    by_id = {s.id: s for s in sessions_1}
    assert by_id["session1a"].state == {"key": "value1a"}
    assert by_id["session1b"].state == {"key": "value1b"}
    sessions_2 = (await session_service.list_sessions(app_name="my_app", user_id="user2")).sessions
    assert len(sessions_2) == 1
    assert sessions_2[0].id == "session2a"
    assert sessions_2[0].state == {"key": "value2a"}
    every = (await session_service.list_sessions(app_name="my_app", user_id=None)).sessions
    assert len(every) == 3
    by_id = {s.id: s for s in every}
    assert by_id["session1a"].state == {"key": "value1a"}
    assert by_id["session1b"].state == {"key": "value1b"}
    assert by_id["session2a"].state == {"key": "value2a"}


@contract
async def test_app_state_is_shared_by_all_users_of_app(
    session_service: AutoContextSessionService,
) -> None:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions

    session1 = await session_service.create_session(
        app_name="my_app", user_id="u1", session_id="s1", state={"app:k1": "v1"}
    )
    event = Event(
        invocation_id="inv1", author="user", actions=EventActions(state_delta={"app:k2": "v2"})
    )
    await session_service.append_event(session=session1, event=event)
    session2 = await session_service.create_session(
        app_name="my_app", user_id="u2", session_id="s2"
    )
    assert session2.state == {"app:k1": "v1", "app:k2": "v2"}
    got = await session_service.get_session(app_name="my_app", user_id="u1", session_id="s1")
    assert got.state.get("app:k1") == "v1"
    assert got.state.get("app:k2") == "v2"


@contract
async def test_user_state_is_shared_only_by_user_sessions(
    session_service: AutoContextSessionService,
) -> None:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions

    session1 = await session_service.create_session(
        app_name="my_app", user_id="u1", session_id="s1", state={"user:k1": "v1"}
    )
    event = Event(
        invocation_id="inv1", author="user", actions=EventActions(state_delta={"user:k2": "v2"})
    )
    await session_service.append_event(session=session1, event=event)
    session1b = await session_service.create_session(
        app_name="my_app", user_id="u1", session_id="s1b"
    )
    assert session1b.state == {"user:k1": "v1", "user:k2": "v2"}
    session2 = await session_service.create_session(
        app_name="my_app", user_id="u2", session_id="s2"
    )
    assert session2.state == {}


@contract
async def test_session_state_is_not_shared(session_service: AutoContextSessionService) -> None:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions

    session1 = await session_service.create_session(
        app_name="my_app", user_id="u1", session_id="s1", state={"sk1": "v1"}
    )
    event = Event(
        invocation_id="inv1", author="user", actions=EventActions(state_delta={"sk2": "v2"})
    )
    await session_service.append_event(session=session1, event=event)
    got = await session_service.get_session(app_name="my_app", user_id="u1", session_id="s1")
    assert got.state.get("sk1") == "v1"
    assert got.state.get("sk2") == "v2"
    session1b = await session_service.create_session(
        app_name="my_app", user_id="u1", session_id="s1b"
    )
    assert session1b.state == {}


@contract
async def test_temp_state_is_not_persisted_in_state_or_events(
    session_service: AutoContextSessionService,
) -> None:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions

    session = await session_service.create_session(app_name="my_app", user_id="u1", session_id="s1")
    event = Event(
        invocation_id="inv1",
        author="user",
        actions=EventActions(state_delta={"temp:k1": "v1", "sk": "v2"}),
    )
    await session_service.append_event(session=session, event=event)
    # Temp state is in the in-memory session (the same invocation) ...
    assert session.state.get("temp:k1") == "v1"
    assert session.state.get("sk") == "v2"
    assert "temp:k1" not in event.actions.state_delta
    # ... and in neither the stored state nor the stored event (ADK's older version of this
    # test, which read the session back).
    got = await session_service.get_session(app_name="my_app", user_id="u1", session_id="s1")
    assert got.state.get("sk") == "v2"
    assert "temp:k1" not in got.state
    assert "temp:k1" not in got.events[0].actions.state_delta
    assert got.events[0].actions.state_delta.get("sk") == "v2"


@contract
async def test_temp_state_visible_across_sequential_events(
    session_service: AutoContextSessionService,
) -> None:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions

    session = await session_service.create_session(
        app_name="my_app", user_id="u1", session_id="s_seq"
    )
    event1 = Event(
        invocation_id="inv1",
        author="agent1",
        actions=EventActions(state_delta={"temp:output": "result_from_a1"}),
    )
    await session_service.append_event(session=session, event=event1)
    assert session.state.get("temp:output") == "result_from_a1"
    assert "temp:output" not in event1.actions.state_delta


@contract
async def test_get_session_respects_user_id(session_service: AutoContextSessionService) -> None:
    from google.adk.events.event import Event

    session1 = await session_service.create_session(
        app_name="my_app", user_id="u1", session_id="s1"
    )
    await session_service.append_event(session1, Event(invocation_id="inv1", author="user"))
    await session_service.create_session(app_name="my_app", user_id="u2", session_id="s1")
    got = await session_service.get_session(app_name="my_app", user_id="u2", session_id="s1")
    assert got.user_id == "u2"
    assert len(got.events) == 0


@contract
async def test_create_session_with_existing_id_raises_error(
    session_service: AutoContextSessionService,
) -> None:
    from google.adk.errors.already_exists_error import AlreadyExistsError

    await session_service.create_session(
        app_name="my_app", user_id="test_user", session_id="existing_session"
    )
    with pytest.raises(AlreadyExistsError):
        await session_service.create_session(
            app_name="my_app", user_id="test_user", session_id="existing_session"
        )


@contract
async def test_append_event_bytes(session_service: AutoContextSessionService) -> None:
    from google.adk.events.event import Event
    from google.genai import types

    session = await session_service.create_session(app_name="my_app", user_id="user")
    test_content = types.Content(
        role="user",
        parts=[types.Part.from_bytes(data=b"test_image_data", mime_type="image/png")],
    )
    test_grounding_metadata = types.GroundingMetadata(
        search_entry_point=types.SearchEntryPoint(sdk_blob=b"test_sdk_blob")
    )
    event = Event(
        invocation_id="invocation",
        author="user",
        content=test_content,
        grounding_metadata=test_grounding_metadata,
    )
    await session_service.append_event(session=session, event=event)
    assert session.events[0].content == test_content
    session = await session_service.get_session(
        app_name="my_app", user_id="user", session_id=session.id
    )
    assert len(session.events) == 1
    assert session.events[0].content == test_content
    assert session.events[0].grounding_metadata == test_grounding_metadata


@contract
async def test_append_event_complete(session_service: AutoContextSessionService) -> None:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.genai import types

    session = await session_service.create_session(app_name="my_app", user_id="user")
    event = Event(
        invocation_id="invocation",
        author="user",
        content=types.Content(role="user", parts=[types.Part(text="test_text")]),
        turn_complete=True,
        partial=False,
        actions=EventActions(artifact_delta={"file": 0}, transfer_to_agent="agent", escalate=True),
        long_running_tool_ids={"tool1"},
        error_code="error_code",
        error_message="error_message",
        interrupted=True,
        grounding_metadata=types.GroundingMetadata(web_search_queries=["query1"]),
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=1, candidates_token_count=1, total_token_count=2
        ),
        citation_metadata=types.CitationMetadata(),
        custom_metadata={"custom_key": "custom_value"},
        timestamp=1700000000.123,
        input_transcription=types.Transcription(text="input transcription", finished=True),
        output_transcription=types.Transcription(text="output transcription", finished=True),
    )
    await session_service.append_event(session=session, event=event)
    assert (
        await session_service.get_session(app_name="my_app", user_id="user", session_id=session.id)
        == session
    )


@contract
async def test_session_last_update_time_updates_on_event(
    session_service: AutoContextSessionService,
) -> None:
    from google.adk.events.event import Event

    session = await session_service.create_session(app_name="my_app", user_id="user")
    original_update_time = session.last_update_time
    event_timestamp = original_update_time + 10
    event = Event(invocation_id="invocation", author="user", timestamp=event_timestamp)
    await session_service.append_event(session=session, event=event)
    assert session.last_update_time == pytest.approx(event_timestamp, abs=1e-6)
    refreshed = await session_service.get_session(
        app_name="my_app", user_id="user", session_id=session.id
    )
    assert refreshed is not None
    assert refreshed.last_update_time == pytest.approx(event_timestamp, abs=1e-6)
    assert refreshed.last_update_time > original_update_time


@contract
async def test_get_session_with_config(session_service: AutoContextSessionService) -> None:
    from google.adk.events.event import Event
    from google.adk.sessions.base_session_service import GetSessionConfig

    num_test_events = 5
    session = await session_service.create_session(app_name="my_app", user_id="user")
    for i in range(1, num_test_events + 1):
        await session_service.append_event(session, Event(author="user", timestamp=i))

    async def events(config: GetSessionConfig | None = None) -> list[Event]:
        got = await session_service.get_session(
            app_name="my_app", user_id="user", session_id=session.id, config=config
        )
        return got.events

    assert len(await events()) == num_test_events
    assert not await events(GetSessionConfig(num_recent_events=0))
    recent = await events(GetSessionConfig(num_recent_events=3))
    assert len(recent) == 3
    assert recent[0].timestamp == num_test_events - 3 + 1
    after = await events(GetSessionConfig(after_timestamp=4.0))
    assert len(after) == num_test_events - 4.0 + 1
    assert after[0].timestamp == 4.0
    assert not await events(GetSessionConfig(after_timestamp=num_test_events * 10))
    both = await events(GetSessionConfig(after_timestamp=4.0, num_recent_events=3))
    assert len(both) == num_test_events - 4.0 + 1


@contract
async def test_partial_events_are_not_persisted(
    session_service: AutoContextSessionService,
) -> None:
    from google.adk.events.event import Event

    session = await session_service.create_session(app_name="my_app", user_id="user")
    await session_service.append_event(session, Event(author="user", partial=True))
    assert len(session.events) == 0
    got = await session_service.get_session(
        app_name="my_app", user_id="user", session_id=session.id
    )
    assert len(got.events) == 0


@contract
async def test_get_user_state_returns_empty_dict_when_no_state_exists(
    session_service: AutoContextSessionService,
) -> None:
    assert not await session_service.get_user_state(app_name="my_app", user_id="u1")


@contract
async def test_get_user_state_returns_state_written_via_append_event(
    session_service: AutoContextSessionService,
) -> None:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions

    session = await session_service.create_session(app_name="my_app", user_id="u1")
    delta = {"user:profile": {"name": "Alice"}, "session_key": 1}
    await session_service.append_event(
        session, Event(author="system", actions=EventActions(state_delta=delta))
    )
    state = await session_service.get_user_state(app_name="my_app", user_id="u1")
    assert state == {"profile": {"name": "Alice"}}
    assert "session_key" not in state


@contract
async def test_get_user_state_is_not_visible_across_users(
    session_service: AutoContextSessionService,
) -> None:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions

    session = await session_service.create_session(app_name="my_app", user_id="u1")
    await session_service.append_event(
        session,
        Event(author="system", actions=EventActions(state_delta={"user:secret": "only-for-u1"})),
    )
    assert not await session_service.get_user_state(app_name="my_app", user_id="u2")


@contract
async def test_get_user_state_is_not_visible_across_apps(
    session_service: AutoContextSessionService,
) -> None:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions

    session = await session_service.create_session(app_name="my_app", user_id="u1")
    await session_service.append_event(
        session,
        Event(author="system", actions=EventActions(state_delta={"user:data": "only-app-a"})),
    )
    assert not await session_service.get_user_state(app_name="other_app", user_id="u1")


@contract
async def test_get_user_state_available_before_session_is_created(
    session_service: AutoContextSessionService,
) -> None:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions

    first = await session_service.create_session(app_name="my_app", user_id="u1")
    await session_service.append_event(
        first, Event(author="system", actions=EventActions(state_delta={"user:ctx": {"v": 1}}))
    )
    assert await session_service.get_user_state(app_name="my_app", user_id="u1") == {
        "ctx": {"v": 1}
    }


@contract
async def test_get_user_state_reflects_latest_write(
    session_service: AutoContextSessionService,
) -> None:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions

    session = await session_service.create_session(app_name="my_app", user_id="u1")
    for n in (1, 2):
        await session_service.append_event(
            session, Event(author="system", actions=EventActions(state_delta={"user:counter": n}))
        )
    state = await session_service.get_user_state(app_name="my_app", user_id="u1")
    assert state["counter"] == 2


@contract
async def test_padded_session_id_reads_and_deletes(
    session_service: AutoContextSessionService,
) -> None:
    # As ADK's in-memory and sqlite services do: a padded id names the same session.
    await session_service.create_session(app_name="my_app", user_id="u1", session_id=" s1 ")
    got = await session_service.get_session(app_name="my_app", user_id="u1", session_id="s1 ")
    assert got is not None and got.id == "s1"
    await session_service.delete_session(app_name="my_app", user_id="u1", session_id=" s1")
    assert (
        await session_service.get_session(app_name="my_app", user_id="u1", session_id="s1") is None
    )


# --- autoctx's own ----------------------------------------------------------------------------


@contract
async def test_ids_with_slashes_stay_apart(session_service: AutoContextSessionService) -> None:
    await session_service.create_session(app_name="a", user_id="u/1", session_id="s")
    await session_service.create_session(app_name="a", user_id="u", session_id="1/s")
    listed = (await session_service.list_sessions(app_name="a")).sessions
    assert sorted((s.user_id, s.id) for s in listed) == [("u", "1/s"), ("u/1", "s")]
    only = (await session_service.list_sessions(app_name="a", user_id="u")).sessions
    assert [(s.user_id, s.id) for s in only] == [("u", "1/s")]


def test_a_bad_namespace_or_client_is_refused(db_url: str, client: AutoContextClient) -> None:
    from autoctx.integrations.adk import AutoContextPlugin, AutoContextSessionService

    with pytest.raises(ConfigError, match="namespace must be a string"):
        AutoContextSessionService(db_url, namespace=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not both"):
        AutoContextSessionService(db_url, client=client)
    with pytest.raises(ConfigError, match="AutoContextSessionService"):
        AutoContextPlugin(object())  # type: ignore[arg-type]


@contract
async def test_a_bad_app_name_is_refused_and_writes_nothing(
    session_service: AutoContextSessionService,
) -> None:
    with pytest.raises(InvalidArgument, match="app_name must be a non-empty string"):
        await session_service.create_session(app_name="", user_id="u", state={"app:k": 1})
    listed = await session_service.list_sessions(app_name="x")
    assert listed.sessions == []


# --- ADK's Runner, a long run -----------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[AnthropicServer]:
    with AnthropicServer(AnthropicAgent(calls_per_run=48)) as srv:
        yield srv


def _runner(
    srv: AnthropicServer,
    service: AutoContextSessionService | Any,
    work: Callable[[int], str],
    *,
    plugin: bool = True,
    extra_tools: Sequence[BaseTool] = (),
    instruction: str = "Run the steps with run_step.",
) -> Runner:
    from anthropic import AsyncAnthropic
    from google.adk.agents.llm_agent import LlmAgent
    from google.adk.apps import App
    from google.adk.models.anthropic_llm import AnthropicLlm
    from google.adk.runners import Runner

    from autoctx.integrations.adk import AutoContextPlugin, AutoContextSessionService, context_tools

    model = AnthropicLlm(
        model="claude-sonnet-4-5", client=AsyncAnthropic(base_url=srv.base_url, api_key="t")
    )

    def run_step(step: int) -> str:
        """Do one step of the work and return its log."""
        return work(step)

    tools: list[Any] = [run_step, *extra_tools]
    if isinstance(service, AutoContextSessionService):
        tools.extend(context_tools(service))
    agent = LlmAgent(name="coder", model=model, instruction=instruction, tools=tools)
    plugins = [AutoContextPlugin(service)] if plugin else []
    app = App(name="coder", root_agent=agent, plugins=plugins)
    return Runner(app=app, session_service=service)


async def _run(runner: Runner, user_id: str, session_id: str, text: str) -> str:
    from google.genai import types

    final = ""
    message = types.Content(role="user", parts=[types.Part(text=text)])
    async for event in runner.run_async(
        user_id=user_id, session_id=session_id, new_message=message
    ):
        if event.content and event.content.parts and event.is_final_response():
            final = "".join(p.text or "" for p in event.content.parts)
    return final


def test_a_long_run_through_the_runner_stays_under_the_window(
    server: AnthropicServer, db_url: str, session_id: str
) -> None:
    from autoctx.integrations.adk import AutoContextSessionService

    scripted = server.agent
    scripted.context_calls = {30: ("context_search", {"query": '"FACT-0005"'})}
    work = framework_runs.Work()

    async def run() -> None:
        service = AutoContextSessionService(
            db_url,
            config=AutoContextConfig(max_tokens=framework_runs.WINDOW),
            summarizer=OfflineSummarizer(),
            namespace=f"{session_id}-",
        )
        await service.create_session(app_name="coder", user_id="ann", session_id="task")
        runner = _runner(server, service, lambda step: work())
        assert await _run(runner, "ann", "task", "Run the 48 steps.") == "All steps are done."
        memory = await service.memory("coder", "ann", "task")
        assert await memory.events(), "the run never compressed"
        # The session is ADK's whole record: every event, whatever was compressed.
        session = await service.get_session(app_name="coder", user_id="ann", session_id="task")
        responses = [
            p.function_response
            for e in session.events
            if e.content
            for p in e.content.parts or []
            if p.function_response
        ]
        assert len(responses) == 48
        framework_runs.assert_reachable(memory.sync, range(1, work.calls + 1))
        await service.close()

    asyncio.run(run())
    assert work.calls == 47  # 48 calls, one of them context_search
    assert server.rejected == []
    assert len(scripted.inputs) == 49
    assert scripted.over(framework_runs.WINDOW) == 0, scripted.largest_request()
    assert scripted.largest_request() > framework_runs.WINDOW // 2
    search = [
        block
        for body in scripted.requests
        for m in body["messages"]
        if isinstance(m["content"], list)
        for block in m["content"]
        if block.get("type") == "tool_result" and "FACT-0005" in str(block.get("content"))
    ]
    assert search, "the context_search answer never reached the model"
    print(
        f"adk long run: {len(scripted.inputs)} requests, largest "
        f"{scripted.largest_request()} / {framework_runs.WINDOW}"
    )


def _declared_tool(name: str, description: str, schema: dict[str, Any]) -> BaseTool:
    """A tool ADK declares to the model and the scripted model never calls."""
    from google.adk.tools.base_tool import BaseTool
    from google.genai import types

    class DeclaredTool(BaseTool):
        def _get_declaration(self) -> types.FunctionDeclaration | None:
            return types.FunctionDeclaration(
                name=self.name, description=self.description, parameters_json_schema=schema
            )

    return DeclaredTool(name=name, description=description)


@pytest.mark.parametrize("measured", [True, False], ids=["measured", "reserve_0"])
def test_the_whole_request_with_many_tools_stays_under_a_small_window(
    server: AnthropicServer, db_url: str, session_id: str, measured: bool
) -> None:
    """The plugin measures each request's tool declarations and system instruction into the
    session's reserve: messages, tools and system text together stay under the window. With
    `reserve_tokens=0` set (no room kept) the same run goes over it."""
    from autoctx.integrations.adk import AutoContextSessionService

    scripted = server.agent
    scripted.calls_per_run = 30
    config = AutoContextConfig(max_tokens=framework_runs.SMALL_WINDOW)
    if not measured:
        config = AutoContextConfig(max_tokens=framework_runs.SMALL_WINDOW, reserve_tokens=0)
    extra = [_declared_tool(*spec) for spec in framework_runs.big_tool_specs()]
    instruction = "Run the steps with run_step. " + AutoContextMemory.system_prompt_snippet()
    work = framework_runs.Work(framework_runs.small_output_size)

    async def run() -> int:
        service = AutoContextSessionService(
            db_url, config=config, summarizer=OfflineSummarizer(), namespace=f"{session_id}-"
        )
        await service.create_session(app_name="coder", user_id="ann", session_id="task")
        runner = _runner(
            server, service, lambda step: work(), extra_tools=extra, instruction=instruction
        )
        assert await _run(runner, "ann", "task", "Run the 30 steps.") == "All steps are done."
        memory = await service.memory("coder", "ann", "task")
        reserve = memory.sync.config.reserve_tokens
        await service.close()
        return reserve

    reserve = asyncio.run(run())
    assert work.calls == 30 and server.rejected == []
    assert len(scripted.requests[0]["tools"]) == 1 + framework_runs.BIG_TOOLS + 2
    framework_runs.assert_whole_requests_fit(scripted, reserve, measured=measured)


def test_without_the_plugin_the_runner_sends_every_event(
    server: AnthropicServer, db_url: str, session_id: str
) -> None:
    """The baseline the plugin is for: ADK's runner builds each request from all the events."""
    from autoctx.integrations.adk import AutoContextSessionService

    scripted = server.agent
    scripted.calls_per_run = 12
    work = framework_runs.Work()

    async def run() -> None:
        service = AutoContextSessionService(
            db_url,
            config=AutoContextConfig(max_tokens=framework_runs.WINDOW),
            summarizer=OfflineSummarizer(),
            namespace=f"{session_id}-",
        )
        await service.create_session(app_name="coder", user_id="ann", session_id="task")
        runner = _runner(server, service, lambda step: work(), plugin=False)
        await _run(runner, "ann", "task", "Run the 12 steps.")
        await service.close()

    asyncio.run(run())
    assert scripted.over(framework_runs.WINDOW) > 0


def test_short_runs_and_a_new_runner_go_on_under_the_window(
    server: AnthropicServer, db_url: str, session_id: str
) -> None:
    from autoctx.integrations.adk import AutoContextSessionService

    scripted = server.agent
    scripted.calls_per_run = 3
    work = framework_runs.Work()

    async def run() -> None:
        config = AutoContextConfig(max_tokens=framework_runs.WINDOW)
        service = AutoContextSessionService(
            db_url, config=config, summarizer=OfflineSummarizer(), namespace=f"{session_id}-"
        )
        await service.create_session(
            app_name="coder", user_id="ann", session_id="chat", state={"user:name": "Ann"}
        )
        runner = _runner(server, service, lambda step: work())
        for k in range(12):
            assert await _run(runner, "ann", "chat", f"Run {k}: three steps.") == (
                "All steps are done."
            )
        await service.close()
        # A new service and runner on the same database: the session goes on.
        again = AutoContextSessionService(
            db_url, config=config, summarizer=OfflineSummarizer(), namespace=f"{session_id}-"
        )
        runner = _runner(server, again, lambda step: work())
        assert await _run(runner, "ann", "chat", "One more.") == "All steps are done."
        first = scripted.requests[-4]["messages"]
        assert any("FACT-" in str(m["content"]) for m in first[:-1])
        session = await again.get_session(app_name="coder", user_id="ann", session_id="chat")
        assert session.state["user:name"] == "Ann"
        memory = await again.memory("coder", "ann", "chat")
        assert await memory.events()
        await again.close()

    asyncio.run(run())
    assert server.rejected == []
    assert scripted.over(framework_runs.WINDOW) == 0, scripted.largest_request()
    assert tool_output(1, 10).startswith("FACT-0001")


def test_without_adk_the_import_error_names_the_extra() -> None:
    message = framework_runs.import_error_without("autoctx.integrations.adk", "google")
    assert "needs Google ADK" in message
    framework_runs.assert_names_the_extra(message, "adk")


def test_the_example_runs_against_the_local_endpoint(db_url: str) -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "adk_agent.py"
    agent = AnthropicAgent(calls_per_run=4)
    with AnthropicServer(agent) as srv:
        out = subprocess.run(
            [sys.executable, str(example), "--base-url", srv.base_url, "--database-url", db_url],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert srv.rejected == []
    assert out.returncode == 0, out.stderr[-2000:]
    assert agent.final_answer in out.stdout
    assert [t["name"] for t in agent.requests[0]["tools"]] == [
        "run_step",
        "context_reload",
        "context_search",
    ]
