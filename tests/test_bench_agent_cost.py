"""Smoke runs of bench/agent_cost.py through the script's own command line, as a user runs it:
autoctx alone on one --quick workload (no peer package needed), and each masking peer through
its own package on small workloads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import URL

BENCH = Path(__file__).resolve().parent.parent / "bench" / "agent_cost.py"


def _bench(admin_url: URL, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--quick",
            "--database-url",
            admin_url.render_as_string(hide_password=False),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _run(
    admin_url: URL, tmp_path: Path, systems: str, workloads: str, *more: str
) -> dict[str, Any]:
    out = tmp_path / f"figures-{systems}.json"
    proc = _bench(
        admin_url, "--systems", systems, "--workloads", workloads, "--json", str(out), *more
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    assert not result["skipped"], result["skipped"]
    return result


def _by_system(result: dict[str, Any], workload: str) -> dict[str, dict[str, Any]]:
    return {f["system"]: f for f in result["workloads"][workload]["systems"]}


def test_agent_cost_quick_autoctx(admin_url: URL, tmp_path: Path) -> None:
    result = _run(admin_url, tmp_path, "autoctx", "toolchat")
    [figures] = result["workloads"]["toolchat"]["systems"]
    assert figures["system"] == "autoctx"
    assert figures["calls_over_window"] == 0
    assert figures["summarizer_calls"] > 0
    # Every fact is in the final context or reachable from it by reload.
    assert figures["facts_reachable"] == figures["facts"] > 0
    # Alone, autoctx is its own reference: no bounded peer ran.
    assert figures["cost_vs_cheapest_bounded_peer"] is None


def test_langchain_masking_peer_masks_first_and_summarizes_as_fallback(
    admin_url: URL, tmp_path: Path
) -> None:
    """ContextEditingMiddleware(ClearToolUsesEdit) with SummarizationMiddleware behind it: the
    edit keeps the long task of large outputs under the window without a summary, and on the
    tool chat the summary still runs (the fallback is real) but less often than LangChain's
    summarization alone, since its trigger sees the masked history."""
    result = _run(admin_url, tmp_path, "langchain,langchain-mask", "bigtask,toolchat")
    big = _by_system(result, "bigtask")
    window = result["workloads"]["bigtask"]["window"]
    masked = big["langchain-mask"]
    assert masked["model_calls"] == big["langchain"]["model_calls"] > 0
    assert masked["calls_over_window"] == 0
    assert masked["peak_tokens"] <= window
    assert masked["outputs_cleared"] > 0
    assert masked["summarizer_calls"] == 0
    # Masking is cheaper than the history it hides: the agent's input is well below LangChain's.
    assert masked["agent_input_tokens"] < big["langchain"]["agent_input_tokens"]

    chat = _by_system(result, "toolchat")
    assert chat["langchain-mask"]["calls_over_window"] == 0
    assert chat["langchain-mask"]["outputs_cleared"] > 0
    assert 0 < chat["langchain-mask"]["summarizer_calls"] < chat["langchain"]["summarizer_calls"]
    # The cheapest bounded peer is one of the two, and the ratios are against it.
    res = result["workloads"]["toolchat"]
    cheapest = chat[res["cheapest_bounded_peer"]]
    assert cheapest["cost_vs_cheapest_bounded_peer"] == 1.0
    assert all(f["cost_vs_cheapest_bounded_peer"] >= 1.0 for f in chat.values())

    # autoctx alone, against the peers' figures of that run.
    earlier = tmp_path / "figures-langchain,langchain-mask.json"
    again = _run(admin_url, tmp_path, "autoctx", "toolchat", "--peers-from", str(earlier))
    rows = _by_system(again, "toolchat")
    assert set(rows) == {"autoctx", "langchain", "langchain-mask"}
    for system in ("langchain", "langchain-mask"):
        assert rows[system]["total_cost"] == chat[system]["total_cost"]
    assert rows["autoctx"]["cost_vs_cheapest_bounded_peer"] == (
        rows["autoctx"]["total_cost"] / cheapest["total_cost"]
    )
    # Figures of another seed are another workload: refused, with the option named.
    refused = _bench(admin_url, "--systems", "autoctx", "--seed", "7", "--peers-from", str(earlier))
    assert refused.returncode != 0
    assert "--peers-from" in refused.stderr and "seed" in refused.stderr


def test_tiered_compaction_peer_clears_first_and_summarizes_through_its_function_model(
    admin_url: URL, tmp_path: Path
) -> None:
    """pydantic-ai-harness TieredCompaction(ClearToolResults, SummarizingCompaction): clearing
    alone bounds the long task of large outputs; on the tool chat the summarizing tier runs,
    its FunctionModel answered by the shared summary server (which counts its calls)."""
    pytest.importorskip(
        "pydantic_ai_harness", reason="pydantic-ai-harness pins its own pydantic-ai release"
    )
    result = _run(admin_url, tmp_path, "tiered", "bigtask,toolchat")
    for workload in ("bigtask", "toolchat"):
        tiered = _by_system(result, workload)["tiered"]
        assert tiered["model_calls"] > 0
        assert tiered["calls_over_window"] == 0
        assert tiered["peak_tokens"] <= result["workloads"][workload]["window"]
        assert tiered["outputs_cleared"] > 0
    assert _by_system(result, "bigtask")["tiered"]["summarizer_calls"] == 0
    chat = _by_system(result, "toolchat")["tiered"]
    assert chat["summarizer_calls"] > 0
    assert chat["summarizer_tokens_in"] > chat["summarizer_tokens_out"] > 0


def test_trajectories_cut_short_play_every_model_call_once(admin_url: URL, tmp_path: Path) -> None:
    """Trajectories as one session: a later system prompt becomes a user note right before its
    task's user message, and a task may stop on tool results. The agent frameworks need a final
    answer to end a turn; the stub they get is not one of the workload's model calls, so each
    peer's calls are exactly the workload's."""
    directory = tmp_path / "trajectories"
    directory.mkdir()
    for k in range(2):
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": f"You are agent {k}."},
            {"role": "user", "content": f"Fix bug {k}."},
        ]
        for j in range(4):
            call = f"c{k}_{j}"
            arguments = json.dumps({"command": f"cat f{j}.py", "timeout": 5})
            msgs.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call,
                            "type": "function",
                            "function": {"name": "bash", "arguments": arguments},
                        }
                    ],
                }
            )
            msgs.append({"role": "tool", "tool_call_id": call, "content": f"line {j}\n" * 50})
        if k == 1:
            msgs.append({"role": "assistant", "content": "Done."})
        (directory / f"t{k}.json").write_text(json.dumps(msgs))
    systems = "langchain,langchain-mask"
    try:
        import pydantic_ai_harness  # noqa: F401
    except ImportError:
        pass
    else:
        systems += ",tiered"
    result = _run(
        admin_url,
        tmp_path,
        systems,
        "",
        "--trajectories",
        str(directory),
        "--window",
        "16000",
    )
    res = result["workloads"]["trajectories"]
    # Calls before each of the 8 assistant messages, and one at the end (cut short).
    assert res["model_calls"] == 9
    rows = _by_system(result, "trajectories")
    assert set(rows) == set(systems.split(","))
    for figures in rows.values():
        assert figures["model_calls"] == 9
        assert figures["calls_over_window"] == 0


def test_a_message_autoctx_made_is_counted_as_the_model_reads_it() -> None:
    """The agent's bill counts a message autoctx made (a masked tool output, a preview) as it
    counts an original with the same content: its tool output included, not its text blocks
    alone, which would bill a masked output as an empty message."""
    sys.path.insert(0, str(BENCH.parent))
    try:
        import agent_cost
    finally:
        sys.path.remove(str(BENCH.parent))
    from autoctx import from_openai_messages

    output = "preview of a large tool output ... <!-- CONTEXT_OFFLOAD: uuid=1234 -->\n" * 3
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": "{}"}}
        ],
    }
    result = {"role": "tool", "tool_call_id": "c1", "content": output}
    made_call, made_result = from_openai_messages([call, result])
    tokens = agent_cost.Tokens()
    assert output.strip() in agent_cost._seen_text(made_result)
    assert tokens.text(agent_cost._seen_text(made_result)) == tokens.message(result)
    assert tokens.text(agent_cost._seen_text(made_call)) >= tokens.message(call) - 2


def test_autoctx_config_option_refuses_what_is_not_a_config(admin_url: URL) -> None:
    for bad in ('{"msg_thresold": 10}', '{"max_tokens": 10}', "[1]", "{"):
        proc = _bench(admin_url, "--systems", "autoctx", "--autoctx-config", bad)
        assert proc.returncode == 2, bad
        assert "--autoctx-config" in proc.stderr


def test_the_agent_shaped_workloads_have_the_shapes_they_claim() -> None:
    """coding-agent: 150-300 steps, most outputs 100-2,000 characters, a few of 50-150 KB, one
    or two user turns; support-agent: 40-80 user turns, small JSON results of 200-1,500
    characters (a fact marker added), constraints restated. Both seeded: the same seed gives
    the same messages."""
    sys.path.insert(0, str(BENCH.parent))
    try:
        import agent_cost
    finally:
        sys.path.remove(str(BENCH.parent))

    coding = agent_cost.coding_agent(42, agent_cost.SIZES["coding-agent"])
    assert coding == agent_cost.coding_agent(42, agent_cost.SIZES["coding-agent"])
    assert 150 <= agent_cost.SIZES["coding-agent"] <= 300
    assert sum(m["role"] == "user" for m in coding) in (1, 2)
    outputs = [len(m["content"]) for m in coding if m["role"] == "tool"]
    marker = len("fact_id=F00001-abcdef\n")
    huge = [n for n in outputs if n > 3_000]
    assert huge and all(50_000 <= n <= 150_000 + marker for n in huge)
    assert len(huge) < len(outputs) / 10
    assert all(100 <= n <= 2_000 + marker for n in outputs if n <= 3_000)

    support = agent_cost.support_agent(42, agent_cost.SIZES["support-agent"])
    assert support == agent_cost.support_agent(42, agent_cost.SIZES["support-agent"])
    users = [m["content"] for m in support if m["role"] == "user"]
    assert 40 <= len(users) <= 80
    results = [m for m in support if m["role"] == "tool"]
    assert results and all(200 <= len(m["content"]) <= 1_500 + marker for m in results)
    restated = [u for u in users if "." in u[:60] and u.split(".")[0] + "." in users[0]]
    assert len(restated) > 2, "the user restates the first turn's constraints"
