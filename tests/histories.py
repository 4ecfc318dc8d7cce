"""Generated agent histories for the tests (deterministic for a given seed)."""

from __future__ import annotations

import json
import random
from typing import Final

from autoctx import AutoContextConfig, Msg, ToolUseBlock

#: Masking off (a floor no tool output reaches): the workloads of the tests of the other rungs
#: are mostly old tool output, which masking alone would bring under the target before any of
#: those rungs ran (docs/design.md §3). tests/test_masking.py tests masking, and the bound's
#: property tests run it with the defaults.
NO_MASKING: Final = {"mask_min_chars": 2**31 - 1}

#: The fact check's repair request off (docs/design.md §6): the configs of tests that count the
#: ladder's own summarizer calls, where one more call per summary that left out a fact would
#: blur what they count; the repair has tests of its own (tests/test_fact_check.py), and the
#: index line stays on everywhere.
NO_REPAIR: Final = {"fact_repair": False}

#: A small window, so that a few generated rounds make every rung of the ladder work (masking
#: and the fact check's repair off: see `NO_MASKING` and `NO_REPAIR`), at the 0.6 target.
SMALL = AutoContextConfig(
    max_tokens=20_000,
    # The token target the ladder's tests were sized for (the default is 0.4: bench/README.md,
    # "Early masking and the defaults").
    target_ratio=0.6,
    msg_threshold=60,
    last_keep=10,
    min_tool_run=3,
    min_compress_tokens=300,
    large_payload_chars=2000,
    preview_chars=100,
    reload_page_chars=1500,
    **NO_MASKING,
    **NO_REPAIR,
)


def file_dump(rng: random.Random, lines: int) -> str:
    return "\n".join(
        f"{n:4d}  def handler_{rng.randrange(10**6)}(request): return {rng.randrange(10**4)}"
        for n in range(lines)
    )


def tool_group(rng: random.Random, call_ids: list[str], big: bool) -> list[Msg]:
    """One assistant message with one or more (parallel) calls and their results."""
    calls = [
        ToolUseBlock(
            cid,
            rng.choice(["read_file", "grep", "run_tests"]),
            json.dumps({"path": f"src/m{rng.randrange(99)}.py"}),
        )
        for cid in call_ids
    ]
    out = [Msg.assistant(None, calls)]
    for c in calls:
        body = file_dump(rng, 120) if big else f"ok {c.name} {rng.randrange(10**6)}"
        out.append(Msg.tool(c.id, body))
    return out


def multi_round(
    seed: int, rounds: int, steps: int, big_every: int = 3, parallel_every: int = 4
) -> list[Msg]:
    """A system prompt, then `rounds` user rounds of `steps` tool groups and a final answer."""
    rng = random.Random(seed)
    msgs = [Msg.system("You are a coding agent.")]
    n = 0
    for r in range(rounds):
        msgs.append(Msg.user(f"Task {r}: fix module {rng.randrange(50)}"))
        for s in range(steps):
            width = 2 if s % parallel_every == parallel_every - 1 else 1
            ids = [f"call_{n + k}" for k in range(width)]
            n += width
            msgs.extend(tool_group(rng, ids, big=s % big_every == 0))
        msgs.append(
            Msg.assistant(f"Round {r} done: patched src/m{rng.randrange(99)}.py, tests pass.")
        )
    return msgs


def long_task(seed: int, steps: int, big_every: int = 2) -> list[Msg]:
    """One user request followed by `steps` tool groups and no final answer yet."""
    rng = random.Random(seed)
    msgs = [Msg.system("You are a coding agent."), Msg.user("Migrate the whole repository.")]
    for s in range(steps):
        msgs.extend(tool_group(rng, [f"t{s}"], big=s % big_every == 0))
    return msgs


def one_heavy_round(seed: int) -> list[Msg]:
    """One heavy finished round of tool work, a light round and a new request: with large
    outputs out of the way, S4 alone brings it under a small target, so it does not give way
    to the fold (use with a window of about 2,900 tokens)."""
    return [
        *multi_round(seed, rounds=1, steps=12, big_every=10_000),
        Msg.user("Thanks."),
        Msg.assistant("You are welcome."),
        Msg.user("Next: the docs."),
    ]
