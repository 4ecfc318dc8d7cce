"""A plain Anthropic Messages API agent loop whose context is autoctx's working memory.

    python examples/anthropic_agent.py                       # Anthropic's API (ANTHROPIC_API_KEY)
    python examples/anthropic_agent.py --base-url http://127.0.0.1:PORT   # any /v1/messages

The repository's tests serve such an endpoint (tests/anthropic_server.py, a scripted model that
calls `run_step` many times, then answers). Each model call gets `mem.to_anthropic()`, which
stays under `--max-tokens` however many steps the run takes; the context tools are offered and
answered; every message is stored in PostgreSQL (`--database-url`, else AUTOCTX_DATABASE_URL,
else the embedded one), and running again with the same `--session` continues the session.
"""

from __future__ import annotations

import argparse
import uuid

import anthropic

from autoctx import AutoContextConfig, AutoContextMemory, Msg

RUN_STEP = {
    "name": "run_step",
    "description": "Run one step of the task and return its log.",
    "input_schema": {"type": "object", "properties": {"step": {"type": "integer"}}},
}


def run_step(step: int) -> str:
    return f"FACT-{step:04d}: step {step} passed.\n" + "log line\n" * 1_500


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default=None)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--session", default=f"anthropic-{uuid.uuid4().hex[:8]}")
    parser.add_argument("--model", default="claude-sonnet-4-5")
    parser.add_argument("--max-tokens", type=int, default=16_000)
    parser.add_argument("--task", default="Run the steps of the task with run_step.")
    args = parser.parse_args()

    client = anthropic.Anthropic(
        base_url=args.base_url, api_key=None if args.base_url is None else "local"
    )
    mem = AutoContextMemory.open(
        args.session, args.database_url, AutoContextConfig(max_tokens=args.max_tokens)
    )
    if mem.message_count() == 0:
        mem.add(Msg.system("You run tasks step by step. " + mem.system_prompt_snippet()))
    mem.add({"role": "user", "content": args.task})
    calls = 0
    while True:
        mem.compress_if_needed()
        system, messages = mem.to_anthropic()
        response = client.messages.create(
            model=args.model,
            max_tokens=1024,
            system=system,
            messages=messages,  # type: ignore[arg-type]
            tools=[RUN_STEP, *mem.tools(format="anthropic")],  # type: ignore[list-item]
        )
        mem.add(response)
        uses = [b for b in response.content if b.type == "tool_use"]
        if not uses:
            break
        results = []
        for use in uses:
            calls += 1
            if use.name.startswith("context_"):
                out = mem.handle_tool_call(use)
            else:
                out = run_step(int(use.input.get("step", calls)))
            results.append({"type": "tool_result", "tool_use_id": use.id, "content": out})
        mem.add({"role": "user", "content": results})
    final = "".join(b.text for b in response.content if b.type == "text")
    print(
        f"session {args.session}: {calls} tool calls, {mem.token_count()} tokens in context, "
        f"{len(mem.events())} compression events"
    )
    print(final)
    mem.close()


if __name__ == "__main__":
    main()
