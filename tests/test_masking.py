"""Masking, strategy 8 (docs/design.md §3): old tool outputs become short previews with their
tag, without an LLM, first in every pass. The planner's rules on hand-built histories (pure),
then a long tool chat on real PostgreSQL through `AutoContextMemory`."""

from __future__ import annotations

import dataclasses
import json
import random
import uuid
from collections.abc import Callable

import pytest
from typer.testing import CliRunner

from autoctx import AutoContextConfig, AutoContextMemory, ConfigError, Msg, export_session
from autoctx._cli import app
from autoctx._plans import Edit, PlanContext
from autoctx._plot import reconstruct
from autoctx._store.inspect import message_stamps
from autoctx._strategies import plan_s2, plan_s8
from autoctx._strategies.registry import ORDER, RUNGS
from autoctx._tags import OFFLOAD_TAG_RE
from autoctx._tools import SEARCH_TOOL_NAME, TOOL_NAME
from tests.dbsql import sql
from tests.histories import SMALL, tool_group
from tests.invariants import assert_every_original_reachable, assert_totals_match
from tests.test_strategies import PRESSURE, Hist, cfg

Open = Callable[..., AutoContextMemory]
OUTPUT = 500  # characters of an old tool output: over the default floor of 200


def masked(edits: list[Edit]) -> list[int]:
    return [e.start for e in edits]


def tool_indices(h: Hist) -> list[int]:
    return [i for i, m in enumerate(h.msgs) if m.role == "tool"]


def rounds(h: Hist, n: int, steps: int, chars: int = OUTPUT) -> None:
    """`n` finished rounds of `steps` tool groups each."""
    for _ in range(n):
        h.user()
        h.steps(steps, chars=chars)
        h.answer()


# ---------------------------------------------------------------------------------------------
# The planner
# ---------------------------------------------------------------------------------------------


def test_masking_is_the_first_rung_and_calls_no_llm() -> None:
    assert ORDER[0] == 8
    assert RUNGS[8].name == "mask" and not RUNGS[8].llm and RUNGS[8].writes == "preview"


def test_masking_keeps_the_most_recent_tool_results() -> None:
    h = Hist()
    h.system()
    rounds(h, 2, steps=4)
    h.user()
    config = cfg(mask_keep=3)
    edits = plan_s8(h.snap(), config, PRESSURE)
    tools = tool_indices(h)
    # Eight outputs in the history: all but the three most recent are masked.
    assert masked(edits) == tools[:-3]
    assert all(e.preview_chars == config.mask_preview_chars for e in edits)
    assert all(not e.llm and e.new_kind == "preview" for e in edits)
    assert masked(plan_s8(h.snap(), cfg(mask_keep=0), PRESSURE)) == tools
    assert plan_s8(h.snap(), cfg(mask_keep=8), PRESSURE) == []


def test_masking_counts_parallel_results_one_by_one() -> None:
    h = Hist()
    h.user()
    h.steps(3, chars=OUTPUT)
    h.group(calls=3, chars=OUTPUT, one_message=True)  # one message answering three calls
    h.answer()
    h.user()
    tools = tool_indices(h)
    # The one message holds the three most recent results: it alone is kept.
    assert masked(plan_s8(h.snap(), cfg(mask_keep=3), PRESSURE)) == tools[:-1]
    assert masked(plan_s8(h.snap(), cfg(mask_keep=4), PRESSURE)) == tools[:-2]


def test_masking_leaves_outputs_at_or_under_the_floor() -> None:
    h = Hist()
    h.user()
    h.steps(2, chars=200)
    short = tool_indices(h)
    h.steps(2, chars=201)
    h.answer()
    h.user()
    h.steps(3, chars=OUTPUT)
    config = cfg(mask_keep=3)
    assert config.mask_min_chars == 2 * config.mask_preview_chars == 200
    edits = plan_s8(h.snap(), config, PRESSURE)
    assert masked(edits) == [i for i in tool_indices(h)[:4] if i not in short]
    # The floor is the caller's to set.
    assert (
        masked(plan_s8(h.snap(), cfg(mask_keep=3, mask_min_chars=150), PRESSURE))
        == (tool_indices(h)[:4])
    )


def test_masking_leaves_pinned_groups_and_context_tool_answers() -> None:
    h = Hist()
    h.user()
    h.group(chars=OUTPUT, pinned=True)
    h.group(chars=OUTPUT, name=TOOL_NAME)
    h.group(chars=OUTPUT, name=SEARCH_TOOL_NAME)
    plain = h.group(chars=OUTPUT)
    h.answer()
    h.user()
    h.steps(3, chars=OUTPUT)
    edits = plan_s8(h.snap(), cfg(mask_keep=3), PRESSURE)
    assert masked(edits) == [plain[0] + 1]
    # The context tools' answers still count among the most recent results.
    h2 = Hist()
    h2.user()
    old = h2.group(chars=OUTPUT)
    h2.answer()
    h2.user()
    h2.steps(3, chars=OUTPUT, name=TOOL_NAME)
    assert masked(plan_s8(h2.snap(), cfg(mask_keep=3), PRESSURE)) == [old[0] + 1]


def test_masking_leaves_the_current_round_unless_it_is_long() -> None:
    h = Hist()
    h.user()
    history = h.steps(2, chars=OUTPUT)
    h.answer()
    h.user()
    h.steps(4, chars=OUTPUT)  # 8 messages after the user message: not over last_keep
    config = cfg(mask_keep=1, last_keep=8)
    assert masked(plan_s8(h.snap(), config, PRESSURE)) == [history[0] + 1, history[0] + 3]


def test_masking_takes_the_old_part_of_a_long_current_round() -> None:
    h = Hist()
    h.system()
    user = h.user()
    h.steps(10, chars=OUTPUT)  # 20 messages after the user message: over last_keep
    config = cfg(mask_keep=1, last_keep=4)
    edits = plan_s8(h.snap(), config, PRESSURE)
    # The whole round but its latest result, the `last_keep` tail included: that tail is S1 to
    # S3's to leave alone, not masking's (a masked output stays reloadable, and a tail kept
    # whole would be re-sent in full after every masking pass).
    latest = tool_indices(h)[-1]
    assert masked(edits) == [i for i in tool_indices(h) if user < i < latest]
    assert any(e.start >= len(h) - config.last_keep for e in edits)
    # Three results kept: the tail's older outputs are masked, the three latest are not.
    kept3 = plan_s8(h.snap(), cfg(mask_keep=3, last_keep=4), PRESSURE)
    assert masked(kept3) == [i for i in tool_indices(h) if user < i < tool_indices(h)[-3]]


def test_masking_takes_an_old_call_with_its_results_never_before() -> None:
    """An old tool call over `mask_min_chars` (a file write's arguments) is masked like an
    output, once every result it has is outside the kept ones."""
    h = Hist()
    h.system()
    h.user()
    pairs = []
    for _ in range(8):
        ids = h._new_calls(1)
        call = h.add("assistant", tokens=400, chars=2_000, call_ids=ids, tool_names=("write",))
        result = h.add("tool", tokens=100, chars=OUTPUT, result_ids=ids, tool_names=("write",))
        pairs.append((call, result))
    config = cfg(mask_keep=3, last_keep=4)
    edits = plan_s8(h.snap(), config, PRESSURE)
    old = pairs[:-3]
    assert masked(edits) == sorted(i for pair in old for i in pair)
    # A call whose result is kept stays whole, however large.
    assert not {call for call, _ in pairs[-3:]} & set(masked(edits))
    # A short call (under the floor) is left alone, as a short output is.
    h2 = Hist()
    h2.user()
    h2.steps(8, chars=OUTPUT)
    assert all(h2.msgs[i].role == "tool" for i in masked(plan_s8(h2.snap(), config, PRESSURE)))


def test_masking_never_masks_twice_and_leaves_summaries() -> None:
    h = Hist()
    h.user()
    h.group(chars=OUTPUT, result_kind="preview")
    h.group(chars=OUTPUT, result_kind="large_summary")
    fresh = h.group(chars=OUTPUT)
    h.answer()
    h.user()
    h.steps(3, chars=OUTPUT)
    assert masked(plan_s8(h.snap(), cfg(mask_keep=3), PRESSURE)) == [fresh[0] + 1]


def test_masked_previews_are_not_previewed_again() -> None:
    """S2 takes only originals: an output masked first is never previewed after."""
    h = Hist()
    h.user()
    h.group(chars=5_000, result_kind="preview")
    big = h.group(chars=5_000)
    h.answer()
    h.user()
    h.steps(6)
    assert [e.start for e in plan_s2(h.snap(), cfg(last_keep=2), PRESSURE)] == [big[0] + 1]


def test_masking_leaves_a_trailing_pending_call_and_failed_ranges() -> None:
    h = Hist()
    h.user()
    first = h.group(chars=OUTPUT)
    second = h.group(chars=OUTPUT)
    h.pending(calls=2, answered=1, chars=OUTPUT)
    config = cfg(mask_keep=0, last_keep=0)
    edits = plan_s8(h.snap(), config, PRESSURE)
    assert masked(edits) == [first[0] + 1, second[0] + 1]
    failed = PlanContext(token_pressure=True, failed=frozenset({edits[0].replaced_ids}))
    assert masked(plan_s8(h.snap(), config, failed)) == [second[0] + 1]


def test_mask_config_is_validated_and_follows_the_preview() -> None:
    config = AutoContextConfig()
    assert (config.mask_keep, config.mask_preview_chars, config.mask_min_chars) == (3, 100, 200)
    wider = AutoContextConfig(mask_preview_chars=300)
    assert wider.mask_min_chars == 600
    assert dataclasses.replace(wider, mask_preview_chars=50).mask_min_chars == 100
    again = AutoContextConfig.from_json(wider.to_json())
    assert again == wider and "mask_min_chars" in again.derived
    with pytest.raises(ConfigError, match="mask_keep"):
        AutoContextConfig(mask_keep=-1)
    with pytest.raises(ConfigError, match="mask_preview_chars"):
        AutoContextConfig(mask_preview_chars=0)
    with pytest.raises(ConfigError, match=r"mask_min_chars \(100\) must be larger than"):
        AutoContextConfig(mask_min_chars=100)
    with pytest.raises(ConfigError, match="mask_min_chars"):
        AutoContextConfig(mask_min_chars=True)


# ---------------------------------------------------------------------------------------------
# On PostgreSQL
# ---------------------------------------------------------------------------------------------


def tool_chat(seed: int, turns: int) -> list[Msg]:
    """A tool chat: each turn a user message, one tool call with a mid-size output (600 to 1,500
    characters: under `large_payload_chars`, so no preview rung would touch it), an answer."""
    rng = random.Random(seed)
    msgs = [Msg.system("You are a helpful agent.")]
    for t in range(turns):
        msgs.append(Msg.user(f"Question {t}: what does module {rng.randrange(50)} do?"))
        call = tool_group(rng, [f"c{t}"], big=False)
        lines = rng.randint(30, 70)
        body = " ".join(f"line {k}: value={rng.randrange(10**6)}" for k in range(lines))
        msgs.extend([call[0], Msg.tool(f"c{t}", body)])
        msgs.append(Msg.assistant(f"Module {t} handles request {rng.randrange(999)}."))
    return msgs


def test_a_long_tool_chat_masks_in_one_transaction_and_reloads_every_original(
    open_memory: Open,
) -> None:
    # SMALL with masking on again, at its defaults.
    config = dataclasses.replace(SMALL, max_tokens=12_000, msg_threshold=1_000, mask_min_chars=200)
    mem = open_memory(config=config)
    added = tool_chat(7, turns=40)
    mem.add(added)
    before = mem.refresh()
    assert before.token_count >= config.token_trigger
    events = mem.compress_if_needed()
    # Masking alone brought the chat under the target: nothing else ran, no summarizer call;
    # and the pass is one event (docs/design.md §7, "one masking pass, one event").
    assert [(e.strategy, e.status, e.model) for e in events] == [(8, "applied", None)]
    (mask,) = events
    after = mem.refresh()
    assert after.token_count < config.token_target
    # One transaction: one version bump, the event's totals those before and after it.
    assert after.version == before.version + 1 == mask.session_version
    assert (mask.tokens_before, mask.tokens_after) == (before.token_count, after.token_count)
    assert (mask.messages_before, mask.messages_after) == (before.message_count,) * 2
    # Every tool output but the three most recent is masked, in place, with its call id and
    # tool name, its head and its tag.
    tools = [m for m in mem.messages() if m.role == "tool"]
    assert [m.kind for m in tools[-3:]] == ["original"] * 3
    masked = tools[:-3]
    assert all(m.kind == "preview" for m in masked)
    # The event names every output it masked, and no single summary or offload: each preview
    # has its own offload and its own lineage row, under the pass's event.
    assert mask.summary_message_id is None and mask.offload_uuid is None
    assert len(mask.replaced_ids) == len(masked)
    lineage = {
        r.summary_id: (r.replaced_id, r.event_id)
        for r in sql(
            mem,
            "select summary_id, replaced_id, event_id from lineage where session_id = :s",
            s=mem.session_id,
        )
    }
    offloads = {
        r.handle: (tuple(r.message_ids), r.event_id)
        for r in sql(
            mem,
            "select handle, message_ids, event_id from offloads where session_id = :s",
            s=mem.session_id,
        )
    }
    assert len(lineage) == len(offloads) == len(masked)
    originals_by_call = {m.tool_results[0].tool_use_id: m for m in added if m.role == "tool"}
    for m in masked:
        result = m.tool_results[0]
        original = originals_by_call[result.tool_use_id]
        text = result.output_text
        head = original.tool_results[0].output_text[: config.mask_preview_chars]
        assert text.startswith(head + "...\n")
        tag = OFFLOAD_TAG_RE.fullmatch(text.splitlines()[-1])
        assert tag is not None
        (back,) = mem.reload(tag.group("handle"))
        assert back.to_openai() == original.to_openai()
        assert result.name and result.name == back.tool_results[0].name
        assert lineage[m.id] == (back.id, mask.id)
        assert offloads[int(tag.group("handle"))] == ((back.id,), mask.id)
    assert sorted(mask.replaced_ids) == sorted(r for r, _ in lineage.values())
    assert_every_original_reachable(mem)
    assert_totals_match(mem)
    # The audit names the rung, once.
    rows = sql(
        mem,
        "select strategy, count(*) as n from compression_events where session_id = :s "
        "group by strategy",
        s=mem.session_id,
    )
    assert [(r.strategy, r.n) for r in rows] == [(8, 1)]
    # A second call with nothing new does nothing.
    assert mem.compress_if_needed() == []


def call_of(m: Msg) -> str:
    return m.tool_results[0].tool_use_id


def test_a_masking_pass_is_one_event_in_every_reader(open_memory: Open, db_url: str) -> None:
    """Every reader of "what did this event write" finds a masking pass's outputs through their
    offloads and lineage, since its one event names none (docs/design.md §7): `dropped()`, the
    CLI's history, dropped and lineage, the export, the plot, search, and the erasure."""
    config = dataclasses.replace(SMALL, max_tokens=12_000, msg_threshold=1_000, mask_min_chars=200)
    mem = open_memory(config=config)
    added = tool_chat(11, turns=40)
    # A word only the tail of one old output holds: a preview never shows it. The id after it
    # is the output's best fact and longer than its preview's facts line (`mask_fact_chars`):
    # it leaves the view.
    k = next(
        i for i, m in enumerate(added) if m.role == "tool" and m.tool_results[0].tool_use_id == "c3"
    )
    long_id = "request_id=req_" + "a1" * 30
    added[k] = Msg.tool("c3", added[k].tool_results[0].output_text + f" quokkafinale {long_id}")
    mem.add(added)
    (mask,) = mem.compress_if_needed()
    assert (mask.strategy, mask.offload_uuid, mask.summary_message_id) == (8, None, None)
    sid = mem.session_id
    offloads = {
        r.uuid: (r.handle, r.message_ids[0])
        for r in sql(
            mem,
            "select uuid, handle, message_ids from offloads "
            "where session_id = :s and event_id = :e",
            s=sid,
            e=mask.id,
        )
    }
    assert len(offloads) == len(mask.replaced_ids) > 1
    previews = {
        int(tag.group("handle")): m
        for m in mem.messages()
        if m.kind == "preview"
        and (tag := OFFLOAD_TAG_RE.fullmatch(m.tool_results[0].output_text.splitlines()[-1]))
    }
    uuid_of_handle = {handle: u for u, (handle, _) in offloads.items()}
    assert set(previews) == set(uuid_of_handle)

    # Search: the hit names the offload of the one output that holds it.
    (hit,) = mem.search("quokkafinale")
    assert hit.offload_handle in previews and offloads[hit.offload_uuid] == (
        hit.offload_handle,
        hit.message_id,
    )
    # dropped(): the facts of every output of the pass that the working context does not show.
    facts = mem.dropped(mask.id)
    assert long_id in facts, "a fact longer than its facts line leaves the view"
    # The CLI: history says how many offloads, `dropped` lists them, `lineage` names a
    # preview's own offload.
    runner = CliRunner()
    out = runner.invoke(app, ["history", sid, "--database-url", db_url], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and f"{len(offloads)}, one per output" in out.output
    out = runner.invoke(app, ["dropped", sid, str(mask.id), "--json", "--database-url", db_url])
    assert out.exit_code == 0
    answer = json.loads(out.output)
    assert set(map(uuid.UUID, answer["offload_uuids"])) == set(offloads)
    assert answer["dropped"] == facts
    handle, preview = next(iter(previews.items()))
    out = runner.invoke(app, ["lineage", sid, str(preview.id), "--json", "--database-url", db_url])
    assert out.exit_code == 0
    tree = json.loads(out.output)["tree"]
    assert uuid.UUID(tree["offload_uuid"]) == uuid_of_handle[handle]
    assert tree["event_id"] == mask.id
    # The export names each preview's offload and handle.
    document = export_session(sid, db_url)
    named = {
        w["id"]: (w["offload_uuid"], w["offload_handle"])
        for w in document["working_messages"]
        if w["kind"] == "preview"
    }
    assert named == {m.id: (str(uuid_of_handle[h]), h) for h, m in previews.items()}
    # The plot: one mark for the pass.
    stamps = message_stamps(mem.engine, sid)
    marks = reconstruct(stamps, mem.events()).marks
    assert [(m.strategy, m.status) for m in marks] == [(8, "applied")]
    # The erasure rebuilds the preview of an erased output under its own handle.
    (original,) = mem.reload(hit.offload_handle)
    mem.erase([original.id or 0], reason="test")
    (rebuilt,) = [
        m
        for m in mem.messages()
        if m.id is not None and m.tool_results and m.tool_results[0].tool_use_id == "c3"
    ]
    last = rebuilt.tool_results[0].output_text.splitlines()[-1]
    tag = OFFLOAD_TAG_RE.fullmatch(last)
    assert tag is not None and int(tag.group("handle")) == hit.offload_handle
    assert "quokkafinale" not in rebuilt.tool_results[0].output_text
    assert_every_original_reachable(mem)


def test_masking_leaves_the_latest_step_whole_while_it_fits() -> None:
    """The latest step (an answered call the model is about to read) is left whole while it
    fits under the target, as S5 and S6 leave it (docs/design.md §3, "the latest step stays
    last"): its results are not masked, even those outside the most recent `mask_keep`."""
    h = Hist()
    h.system()
    user = h.user()
    h.steps(10, chars=OUTPUT)  # a long current round
    step, _ = h.group(calls=6, chars=OUTPUT)
    edits = plan_s8(h.snap(), cfg(mask_keep=3, last_keep=4), PRESSURE)
    assert masked(edits) == [i for i in tool_indices(h) if user < i < step]


def test_masking_shrinks_a_latest_step_that_does_not_fit() -> None:
    """A latest step over the target on its own: masking its results outside the most recent
    `mask_keep` is the cheapest way to shrink it (no summarizer, every output reloadable)."""
    h = Hist()
    h.system()
    h.user()
    h.steps(10, chars=OUTPUT)
    step, end = h.group(calls=6, chars=OUTPUT, tokens=1_500)
    config = cfg(mask_keep=3, last_keep=4)
    assert sum(m.tokens for m in h.msgs[step:end]) > config.token_target
    edits = plan_s8(h.snap(), config, PRESSURE)
    assert [i for i in masked(edits) if i >= step] == tool_indices(h)[-6:-3]
