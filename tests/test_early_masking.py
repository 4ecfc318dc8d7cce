"""Early masking (docs/design.md §3): under the token trigger, once the working context reaches
`mask_ratio` of the window, masking runs alone (no LLM, no other rung) when what it saves pays
for the prompt cache it breaks; and each masked preview carries a line of its output's best
facts. On real PostgreSQL through `AutoContextMemory`, with the summarizer a real local HTTP
server speaking the OpenAI protocol, so that "no LLM call" is what the server saw."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Iterator

import pytest

from autoctx import (
    AutoContextConfig,
    AutoContextMemory,
    ConfigError,
    Msg,
    OpenAISummarizer,
    ToolUseBlock,
)
from autoctx._compressor import MASK_ALONE_PAYS
from autoctx._tags import OFFLOAD_TAG_RE
from autoctx._trigger import turnover_messages
from tests.invariants import assert_every_original_reachable, assert_totals_match
from tests.openai_server import OpenAIServer

Open = Callable[..., AutoContextMemory]

#: A 16,000-token window: the mask trigger at the default 0.15 is 2,400 tokens, the token
#: trigger 12,000.
CONFIG = AutoContextConfig(max_tokens=16_000)


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as s:
        yield s


def step(rng: random.Random, k: int, chars: int) -> list[Msg]:
    """One tool step: a call and an output of `chars` characters with one labelled id in it."""
    call = Msg.assistant(None, [ToolUseBlock(f"c{k}", "run_tests", '{"path": "tests"}')])
    lines = [f"test_{k}_{n} passed in {rng.randrange(900)} ms" for n in range(chars // 32)]
    lines.insert(len(lines) // 2, f"run_id=R{k:04d}-{rng.getrandbits(24):06x}")
    return [call, Msg.tool(f"c{k}", "\n".join(lines))]


def test_masking_runs_alone_under_the_trigger_without_a_summarizer_call(
    open_memory: Open, server: OpenAIServer
) -> None:
    summarizer = OpenAISummarizer(
        base_url=server.base_url, api_key="test", timeout=10, max_retries=0
    )
    mem = open_memory(config=CONFIG, summarizer=summarizer)
    rng = random.Random(3)
    mem.add([Msg.system("You are a coding agent."), Msg.user("Make the tests pass.")])
    masked_events = 0
    for k in range(40):
        mem.add(step(rng, k, 1_500))
        before = mem.refresh().token_count
        events = mem.compress_if_needed()
        # Never the ladder: the context stays under the token trigger all along.
        assert before < CONFIG.token_trigger
        assert all(e.strategy == 8 and e.status == "applied" for e in events)
        masked_events += len(events)
        if events:
            assert mem.refresh().token_count < before
    # Forty steps of about 400 tokens: over the token trigger by far without early masking.
    assert sum(m.tokens for m in mem.messages()) < CONFIG.token_trigger
    assert masked_events > 0
    assert server.requests == []  # masking alone asks no summarizer
    tools = [m for m in mem.messages() if m.role == "tool"]
    assert [m.kind for m in tools[-3:]] == ["original"] * 3  # mask_keep
    assert all(m.kind == "preview" for m in tools[:-6])
    assert_every_original_reachable(mem)
    assert_totals_match(mem)


def test_a_masked_preview_carries_its_outputs_labelled_ids_and_reloads(
    open_memory: Open,
) -> None:
    mem = open_memory(config=CONFIG)
    rng = random.Random(5)
    added: list[Msg] = [Msg.system("You are a coding agent."), Msg.user("Go.")]
    for k in range(12):
        added.extend(step(rng, k, 1_500))
    mem.add(added)
    mem.compress_if_needed()
    originals = {m.tool_results[0].tool_use_id: m for m in added if m.role == "tool"}
    previews = [m for m in mem.messages() if m.kind == "preview"]
    assert previews
    for m in previews:
        text = m.tool_results[0].output_text
        original = originals[m.tool_results[0].tool_use_id].tool_results[0].output_text
        lines = text.splitlines()
        head = original[: CONFIG.mask_preview_chars]
        assert text.startswith(head + "...\n")
        tag = OFFLOAD_TAG_RE.fullmatch(lines[-1])
        assert tag is not None
        # The line before the tag lists facts of the output that its head does not show,
        # the labelled run id first, within `mask_fact_chars`.
        facts = lines[-2]
        assert facts.startswith("facts: ") and len(facts) <= CONFIG.mask_fact_chars
        run_id = next(x for x in original.splitlines() if x.startswith("run_id="))
        assert facts.removeprefix("facts: ").split(" | ")[0] == run_id
        (back,) = mem.reload(tag.group("handle"))
        assert back.tool_results[0].output_text == original


def test_masking_alone_waits_while_it_would_not_pay(open_memory: Open) -> None:
    """Outputs just over the floor behind a long tail: masking them would save less than
    `MASK_ALONE_PAYS` of the tail a prompt cache must read again, so nothing runs until the
    trigger; the same outputs at the trigger are masked by the ladder."""
    config = dataclasses.replace(CONFIG, mask_keep=1)
    mem = open_memory(config=config)
    rng = random.Random(9)
    mem.add([Msg.system("You are a coding agent."), Msg.user("Go.")])
    for k in range(2):
        mem.add(step(rng, k, 260))  # just over mask_min_chars (200)
    # A long tail of prose after them (not tool output: nothing masking could take).
    mem.add([Msg.assistant("notes " + "word " * 2_500)])
    mem.add(step(rng, 99, 260))
    info = mem.refresh()
    assert config.mask_trigger is not None
    assert config.mask_trigger <= info.token_count < config.token_trigger
    assert mem.compress_if_needed() == []
    assert [m.kind for m in mem.messages() if m.role == "tool"] == ["original"] * 3
    assert MASK_ALONE_PAYS > 0


def test_masking_alone_plans_again_only_after_the_context_grew(open_memory: Open) -> None:
    mem = open_memory(config=CONFIG)
    rng = random.Random(11)
    mem.add([Msg.system("You are a coding agent."), Msg.user("Go.")])
    for k in range(8):
        mem.add(step(rng, k, 1_500))
    first = mem.compress_if_needed()
    assert first and {e.strategy for e in first} == {8}
    # A small append (under min_compress_tokens) does not make it look again, even though one
    # more output left the kept three.
    mem.add(step(rng, 8, 240))
    assert mem.compress_if_needed() == []
    # Enough new tokens: it looks again and masks what pays.
    for k in range(9, 13):
        mem.add(step(rng, k, 1_500))
    assert {e.strategy for e in mem.compress_if_needed()} == {8}


def test_an_output_the_kept_results_held_back_is_masked_once_they_moved_on(
    open_memory: Open,
) -> None:
    """A large output that the latest steps held back (the kept results, the latest step) is
    masked once `mask_keep` more steps came in, although they added far fewer tokens than
    `min_compress_tokens`: the look again follows the kept results turning over too."""
    config = AutoContextConfig(max_tokens=128_000)
    assert turnover_messages(config) == 2 * config.mask_keep
    mem = open_memory(config=config)
    rng = random.Random(19)
    mem.add([Msg.system("You are a coding agent."), Msg.user("Go.")])
    # A long task (more than `last_keep` messages in the round) of short shell results, which
    # are under `mask_min_chars`: nothing to mask.
    for k in range(config.last_keep):
        mem.add(step(rng, -k, 150))
    mem.add(step(rng, 0, 100_000))  # a file dump: the latest step, kept whole
    assert config.mask_trigger is not None
    assert mem.refresh().token_count >= config.mask_trigger
    assert mem.compress_if_needed() == []
    left = mem.refresh().token_count
    # Short shell steps: the dump is among the kept results until `mask_keep` of them came.
    for k in range(1, config.mask_keep):
        mem.add(step(rng, k, 150))
        assert mem.compress_if_needed() == []
    mem.add(step(rng, config.mask_keep, 150))
    assert mem.refresh().token_count < left + config.min_compress_tokens
    events = mem.compress_if_needed()
    assert [(e.strategy, e.status) for e in events] == [(8, "applied")]
    tools = [m for m in mem.messages() if m.role == "tool"]
    assert [m.kind for m in tools[-config.mask_keep - 1 :]] == ["preview"] + ["original"] * 3
    assert {m.kind for m in tools[: -config.mask_keep - 1]} == {"original"}
    assert_every_original_reachable(mem)
    assert_totals_match(mem)


def test_an_old_file_write_is_masked_with_its_call_ids_and_short_arguments(
    open_memory: Open,
) -> None:
    """A long task that writes files: the old calls' arguments (the files' content) are masked
    with their outputs; each call keeps its id and tool name, its arguments stay a JSON object
    with the path whole and the content cut to its head, its text carries the tag, and the
    original reloads."""
    mem = open_memory(config=CONFIG)
    rng = random.Random(23)
    mem.add([Msg.system("You are a coding agent."), Msg.user("Write the modules.")])
    added: dict[str, Msg] = {}
    for k in range(30):
        body = "\n".join(
            f"def f_{k}_{n}(x):\n    return x * {rng.randrange(99)}" for n in range(40)
        )
        arguments = json.dumps({"path": f"src/mod_{k}.py", "content": body})
        call = Msg.assistant(
            f"Writing module {k}.", [ToolUseBlock(f"w{k}", "write_file", arguments)]
        )
        added[f"w{k}"] = call
        mem.add([call, Msg.tool(f"w{k}", f"wrote {len(body)} characters to src/mod_{k}.py " * 8)])
        mem.compress_if_needed()
    calls = [m for m in mem.messages() if m.role == "assistant" and m.tool_uses]
    masked_calls = [m for m in calls if m.kind == "preview"]
    assert masked_calls and calls[-CONFIG.mask_keep :] == [
        m for m in calls[-CONFIG.mask_keep :] if m.kind == "original"
    ]
    for m in masked_calls:
        (use,) = m.tool_uses
        original = added[use.id]
        (was,) = original.tool_uses
        assert use.name == "write_file"
        args = json.loads(use.arguments)
        assert args["path"] == json.loads(was.arguments)["path"]
        assert (
            args["content"]
            == json.loads(was.arguments)["content"][: CONFIG.mask_preview_chars] + "..."
        )
        tag = OFFLOAD_TAG_RE.search(m.text)
        assert tag is not None and m.text.startswith(original.text)
        (back,) = mem.reload(tag.group("handle"))
        assert back.to_openai() == original.to_openai()
    assert_every_original_reachable(mem)
    assert_totals_match(mem)


def test_without_a_mask_ratio_masking_waits_for_the_trigger(open_memory: Open) -> None:
    config = dataclasses.replace(CONFIG, mask_ratio=None)
    assert config.mask_trigger is None
    mem = open_memory(config=config)
    rng = random.Random(13)
    mem.add([Msg.system("You are a coding agent."), Msg.user("Go.")])
    for k in range(10):
        mem.add(step(rng, k, 1_500))
    assert mem.refresh().token_count < config.token_trigger
    assert mem.compress_if_needed() == []


def test_early_masking_config_is_validated() -> None:
    assert (CONFIG.mask_ratio, CONFIG.mask_fact_chars) == (0.15, 48)
    assert CONFIG.mask_trigger == int(CONFIG.message_window * 0.15)
    again = AutoContextConfig.from_json(CONFIG.to_json())
    assert again == CONFIG
    for bad in (1.0, -0.1, "0.2", True):
        with pytest.raises(ConfigError, match="mask_ratio"):
            AutoContextConfig(mask_ratio=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="mask_fact_chars"):
        AutoContextConfig(mask_fact_chars=-1)
    assert AutoContextConfig(mask_ratio=0.0).mask_trigger == 0


def test_a_second_call_without_new_messages_does_nothing(open_memory: Open) -> None:
    """docs/design.md §2, "no work for nothing", on the early-masking path: a call right after
    one that masked, with nothing appended, writes nothing."""
    mem = open_memory(config=CONFIG)
    rng = random.Random(17)
    mem.add([Msg.system("You are a coding agent."), Msg.user("Go.")])
    for k in range(8):
        mem.add(step(rng, k, 1_500))
    assert {e.strategy for e in mem.compress_if_needed()} == {8}
    version = mem.refresh().version
    assert mem.compress_if_needed() == []
    assert mem.refresh().version == version
