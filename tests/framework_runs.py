"""What the framework integration tests share (the Agents SDK, LangChain, AgentScope, Pydantic
AI): the window and the work tool of their runs against the scripted agent
(tests/agent_model.py), the checks of what a run sent and stored, the check that an integration
opened its memory through the client it was given, and the import error of an integration whose
framework is not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import pytest

from autoctx import AutoContextClient, AutoContextMemory, SessionNotFound
from autoctx._store.database import resolve_url
from autoctx._strategies.registry import CURRENT_ROUND
from autoctx._tokens import get_encoding
from tests.agent_model import ScriptedAgent, tool_output
from tests.dbsql import sql

T = TypeVar("T")

_ENCODING = get_encoding("o200k_base")

#: The window of every framework run: a few 2-20 KB tool outputs fill it.
WINDOW = 16_000


def output_size(step: int, stride: int = 7_919) -> int:
    """2-20 KB, varying from step to step (`stride` gives each test file its own sequence)."""
    return 2_000 + (step * stride) % 18_001


class Work:
    """The body of the scripted agent's work tool, which each test wraps in its framework's
    tool: call n returns `tool_output(n, size(n))` (`output_size` unless told), so call n's fact
    is ``FACT-n``."""

    def __init__(self, size: Callable[[int], int] = output_size) -> None:
        self.calls = 0
        self.size = size

    def __call__(self) -> str:
        self.calls += 1
        return tool_output(self.calls, self.size(self.calls))


def work_tool(decorate: Callable[[Callable[[int], str]], T], body: Work) -> T:
    """The scripted agent's work tool as a framework's tool: `decorate` is the framework's
    tool decorator (LangChain's `tool`, the Agents SDK's `function_tool`), which reads the
    tool's name, docstring and parameters from the function."""

    def work(step: int) -> str:
        """Do one step of the work and return its log."""
        return body()

    return decorate(work)


#: The window of the long-task runs that reach S6 mid-task (a few 2-6 KB outputs fill it): the
#: context is compressed right before a model call, when it ends with the tool results the model
#: is about to read.
SMALL_WINDOW = 6_000


def small_output_size(step: int) -> int:
    """2-6 KB, varying from step to step: a step of `SMALL_WINDOW` runs."""
    return 2_000 + (step * 7_919) % 4_001


#: The extra tools of the reserve tests: a real agent offers tens of tools with long
#: descriptions, about 2,000 tokens of definitions here, a third of `SMALL_WINDOW`.
BIG_TOOLS = 12


def big_tool_specs(count: int = BIG_TOOLS) -> list[tuple[str, str, dict[str, Any]]]:
    """`count` tool definitions as `(name, description, JSON schema of the parameters)`, each
    about 150 tokens as sent; a framework test wraps them in its tools (which are never called)."""
    specs = []
    for k in range(count):
        description = (
            f"Inspect part {k} of the repository: read the files it names, list the symbols "
            f"they define and report every call site of those symbols with its line number, "
            f"so that a change to part {k} can be checked against everything that uses it."
        )
        parameters = {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": f"The directory of part {k}."},
                "depth": {"type": "integer", "description": "How many levels of calls."},
            },
            "required": ["path"],
        }
        specs.append((f"inspect_part_{k:02d}", description, parameters))
    return specs


def tools_tokens(body: Mapping[str, Any]) -> int:
    """The tokens of a request's tool definitions as sent (their JSON, o200k_base)."""
    return len(_ENCODING.encode_ordinary(json.dumps(body.get("tools") or [])))


def whole_requests(agent_model: Any) -> list[int]:
    """The tokens of every request the scripted model received, whole: its messages and system
    text (the server's count) plus its tool definitions."""
    return [
        tokens + tools_tokens(body)
        for tokens, body in zip(agent_model.inputs, agent_model.requests, strict=True)
    ]


def assert_whole_requests_fit(agent_model: Any, mem_reserve: int, *, measured: bool) -> None:
    """With the reserve measured (the default) every whole request of the run stayed under
    `SMALL_WINDOW` and the reserve covers the tools; with no reserve (`reserve_tokens=0` set)
    some request went over: the tools are what the messages' bound leaves out."""
    whole = whole_requests(agent_model)
    tools = tools_tokens(agent_model.requests[0])
    assert tools > SMALL_WINDOW // 4, tools  # the run's tools are a large share of the window
    print(
        f"whole requests: largest {max(whole)} / {SMALL_WINDOW}, "
        f"tools {tools}, reserve {mem_reserve}"
    )
    if measured:
        assert tools * 0.8 < mem_reserve, (tools, mem_reserve)
        assert max(whole) < SMALL_WINDOW, max(whole)
    else:
        assert mem_reserve == 0
        assert max(whole) >= SMALL_WINDOW, max(whole)


def assert_every_request_ends_with_input(agent_model: ScriptedAgent) -> None:
    """Every request the framework sent ended with what the model has to read (the user's
    prompt or a tool result), never with an assistant message such as autoctx's own summary:
    the model would see nothing new after it (Chat Completions), continue it as a prefill
    (Anthropic), or the framework would refuse it (Pydantic AI)."""
    ends = [body["messages"][-1]["role"] for body in agent_model.requests]
    wrong = [k for k, role in enumerate(ends) if role not in ("user", "tool")]
    assert not wrong, f"requests {wrong} end with {[ends[k] for k in wrong]}"


def assert_current_round_summarized(mem: AutoContextMemory) -> None:
    """The run reached S6 (docs/design.md §3), the rung whose summary used to end the context."""
    events = mem.events()
    assert any(e.strategy == CURRENT_ROUND and e.status == "applied" for e in events), [
        (e.strategy, e.status) for e in events
    ]


def assert_under_window(agent_model: ScriptedAgent, window: int = WINDOW) -> None:
    """No request the framework sent was over `window`."""
    assert agent_model.over(window) == 0, agent_model.largest_request()


def answers_to(agent_model: ScriptedAgent, name: str) -> list[str]:
    """The tool results the model was sent for its calls of context tool `name` (without the
    bold markup a search answer puts on its query)."""
    ids = {
        call["id"]
        for body in agent_model.requests
        for m in body["messages"]
        if m["role"] == "assistant"
        for call in m.get("tool_calls") or []
        if call["function"]["name"] == name
    }
    answers: dict[str, str] = {}
    for body in agent_model.requests:
        for m in body["messages"]:
            if m["role"] == "tool" and m["tool_call_id"] in ids:
                answers.setdefault(m["tool_call_id"], m["content"])
    return [a.replace("**", "") for a in answers.values()]


def stored_originals(mem: AutoContextMemory) -> list[dict[str, Any]]:
    """The session's originals (not written by a compression), oldest first, as stored."""
    rows = sql(
        mem,
        "select role, content from messages where session_id = :s and kind = 'original'"
        " and event_id is null order by id",
        s=mem.session_id,
    )
    return [{"role": r[0], "content": r[1]} for r in rows]


def assert_each_stored_once(mem: AutoContextMemory, *, prompts: int, calls: int) -> None:
    """Every user prompt and every tool output of the runs is one original, none twice."""
    originals = stored_originals(mem)
    users = [o for o in originals if o["role"] == "user"]
    results = [
        block["tool_use_id"]
        for o in originals
        if o["role"] == "tool"
        for block in o["content"]
        if block.get("type") == "tool_result"
    ]
    assert len(users) == prompts
    assert len(results) == len(set(results)) == calls


def assert_searches_found_the_fact(agent_model: ScriptedAgent, *, later_runs: int) -> None:
    """The restart tests' agent searches for FACT-0002 once a run: every search the model saw
    answered found it, except the first run's, made before its second call wrote it (that answer
    found nothing, and is still in the history when no compression took it out)."""
    first, *later = answers_to(agent_model, "context_search")
    assert len(later) >= later_runs and all("FACT-0002" in a for a in later)
    assert "FACT-0002" in first or first.startswith("No message in this session matches")


def assert_reachable(mem: AutoContextMemory, facts: Sequence[int]) -> None:
    """Each tool output is found by the context tools' search and read back whole."""
    for n in facts:
        fact = f"FACT-{n:04d}"
        head = tool_output(n, 200).splitlines()[0]

        def reload(message_id: int) -> str:
            arguments = json.dumps({"message_id": message_id})
            call = {
                "type": "function",
                "function": {"name": "context_reload", "arguments": arguments},
            }
            return mem.handle_tool_call(call)

        hits = mem.search(f'"{fact}"', limit=50)
        assert any(head in reload(hit.message_id) for hit in hits), fact


def no_shared_client(db_url: str) -> bool:
    """Whether the process holds no shared client of `db_url` (`AutoContextClient.shared`)."""
    key = resolve_url(db_url).render_as_string(hide_password=False)
    return key not in AutoContextClient._shared


def assert_opened_through(client: AutoContextClient, mem: AutoContextMemory, db_url: str) -> None:
    """`mem` was opened through `client` and nothing through the shared client of `db_url`
    (closed before the integration ran): the memory is on the client's pool, outlives the
    shared clients, and `client.close()` closes it."""
    assert mem.engine is client.engine
    assert no_shared_client(db_url), "the integration opened a shared client"
    AutoContextClient.close_shared(db_url)
    assert mem.messages(), "closing the shared clients closed a memory of the given client"
    client.close()
    with pytest.raises(SessionNotFound, match="closed"):
        mem.messages()


_WITHOUT = """
import importlib, importlib.abc, json, sys
blocked = set(sys.argv[2:])
class Without(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Without())
try:
    importlib.import_module(sys.argv[1])
except ModuleNotFoundError as exc:
    print(json.dumps({"message": str(exc), "name": exc.name}))
"""


def import_error_without(module: str, package: str) -> str:
    """The message of the `ModuleNotFoundError` that importing `module` raises in a child
    interpreter where `package` cannot be found, as on an install without the extra; the
    error is `package`'s own (its `name`), not another module's."""
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT, module, package],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout, f"importing {module} without {package} raised nothing"
    error = json.loads(out.stdout)
    assert error["name"].split(".")[0] == package, error["name"]
    message: str = error["message"]
    return message


def assert_names_the_extra(message: str, extra: str) -> None:
    """The message says which extra to install, from the package index and in a checkout."""
    assert f'pip install "autoctx-pg[{extra}]"' in message, message
    assert f'pip install -e ".[{extra}]"' in message, message
