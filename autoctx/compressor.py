"""The compression loop (SPEC.md section 2): the only place that loops.

check the trigger (session row) -> snapshot -> strategies in order -> summariser (no lock held)
-> `Store.apply` (one transaction) -> re-check, until under the target or no progress.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._faults import pause_point
from .config import AutoContextConfig
from .errors import SummarizerError
from .events import Event
from .intake import Prepared, count_tokens
from .messages import Block, Msg, OpaqueBlock, TextBlock, ToolResultBlock, ToolUseBlock
from .plans import Edit, PlanContext, Snapshot
from .prompts import build_request, offload_tag
from .store.rows import SessionInfo
from .store.store import Replacement, Store
from .strategies import plan as plan_strategy
from .summarizers import Summarizer, check_answer
from .tokens import TokenCounter

logger = logging.getLogger("autoctx")

STRATEGIES = (1, 2, 3, 4, 5, 6)
#: The strategies that act on what precedes the current round (the others rewrite only what
#: follows the latest user message).
HISTORY_STRATEGIES = frozenset({1, 2, 3, 4})


@dataclass(frozen=True, slots=True)
class Trigger:
    by_count: bool
    by_tokens: bool

    @property
    def fired(self) -> bool:
        return self.by_count or self.by_tokens

    @property
    def reason(self) -> str:
        return "tokens" if self.by_tokens else "count"


def trigger_of(message_count: int, token_count: int, config: AutoContextConfig) -> Trigger:
    return Trigger(
        by_count=message_count >= config.msg_threshold,
        by_tokens=token_count >= config.token_trigger,
    )


def under_target(message_count: int, token_count: int, config: AutoContextConfig) -> bool:
    return token_count < config.token_target and message_count < config.msg_target


@dataclass
class _CallState:
    """Budgets and memory of one `compress_if_needed()` call."""

    #: The plan attached to the session (for the summaries' plan hint), read once per call.
    plan: Mapping[str, Any] | None = None
    llm_calls: int = 0
    failed: set[tuple[int, ...]] = field(default_factory=set)
    events: list[Event] = field(default_factory=list)
    #: Whether the token floor was waived when S1 to S4 last planned nothing, if only S5 or S6
    #: have applied since (else None). Those two rewrite only what follows the latest user
    #: message and only lower the totals, which can only take candidates away from S1 to S4
    #: (their ranges end below the current round; S2 and S3 need tokens over the target), so
    #: with the same floor the history strategies would find nothing again: the next pass
    #: skips them.
    history_quiet: bool | None = None


#: Sessions already warned about in this process (the warning would otherwise repeat on
#: every call: each append moves the session to a new version, and the ladder tries again).
_warned_over_trigger: set[str] = set()


def _warn_over_trigger(session_id: str, info: SessionInfo, cfg: AutoContextConfig) -> None:
    if session_id in _warned_over_trigger:
        return
    _warned_over_trigger.add(session_id)
    logger.warning(
        "autoctx: session %r is still over its compression trigger after compressing "
        "(%d messages, %d tokens; the trigger is %d messages or %d tokens): no strategy finds "
        "more to do, and the working context will keep growing. Rounds lighter than "
        "min_compress_tokens (%d) are not summarised and user messages are kept: lower "
        "min_compress_tokens, or pin fewer messages (logged once per session and process)",
        session_id,
        info.message_count,
        info.token_count,
        cfg.msg_threshold,
        cfg.token_trigger,
        cfg.min_compress_tokens,
    )


class Compressor:
    def __init__(
        self,
        store: Store,
        session_id: str,
        config: AutoContextConfig,
        counter: TokenCounter,
        summarizer: Summarizer,
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.config = config
        self.counter = counter
        self.summarizer = summarizer

    def run(self, info: SessionInfo) -> list[Event]:
        cfg = self.config
        if not trigger_of(info.message_count, info.token_count, cfg).fired:
            return []
        if info.settled_version == info.version:
            # An earlier call at this very version could not reach the target: nothing new
            # to try until the session changes.
            return []
        state = _CallState(plan=info.plan)
        for _ in range(cfg.max_passes):
            snap = self.store.snapshot(self.session_id)
            if under_target(snap.message_count, snap.token_count, cfg):
                return state.events
            outcome = self._pass(snap, state)
            if outcome == "conflict":
                state.history_quiet = None  # another writer: nothing known about the new state
                continue  # plan again from a new snapshot
            if outcome == "stalled":
                break
        final = self.store.totals(self.session_id)
        if not under_target(final.message_count, final.token_count, cfg):
            self.store.settle(self.session_id, final.version)
            if trigger_of(final.message_count, final.token_count, cfg).fired:
                _warn_over_trigger(self.session_id, final, cfg)
        return state.events

    # -- one pass -----------------------------------------------------------------------------

    def _allowed(self, strategy: int, snap: Snapshot) -> bool:
        """Which rungs may act at this pressure (SPEC.md section 2).

        S1 and S4 shrink the message count and may always act; previews (S2, S3) only save
        tokens, so they act while tokens are over the target; S5 and S6 only while the token
        trigger itself holds.
        """
        if strategy in (2, 3):
            return snap.token_count >= self.config.token_target
        return True  # S5 and S6 check the token trigger themselves (`PlanContext.token_pressure`)

    def _pass(self, snap: Snapshot, state: _CallState) -> str:
        """Try S1..S6 in order and apply the first that finds work.

        Returns "progress" when working tokens fell, "conflict" when the apply lost a race,
        "stalled" otherwise.
        """
        cfg = self.config
        trig = trigger_of(snap.message_count, snap.token_count, cfg)
        reason = (
            trig.reason
            if trig.fired
            else ("tokens" if snap.token_count >= cfg.token_target else "count")
        )
        # Without the token trigger, S1/S4 act without their token floor while the message
        # count is over its target (count pressure); a call that goes on for tokens alone keeps
        # the floor, so that it does not summarise every small round one by one.
        ctx = PlanContext(
            token_pressure=trig.by_tokens,
            failed=frozenset(state.failed),
            count_pressure=snap.message_count >= cfg.msg_target,
        )
        skip_history = state.history_quiet == ctx.floor_waived
        history_found = False
        for strategy in STRATEGIES:
            if strategy in HISTORY_STRATEGIES and skip_history:
                continue
            if not self._allowed(strategy, snap):
                continue
            edits = plan_strategy(strategy, snap, cfg, ctx)
            if not edits:
                continue
            if strategy in HISTORY_STRATEGIES:
                history_found = True
            replacements = self._build(snap, edits, state, reason)
            if not replacements:
                continue  # every range failed: the ladder moves on
            outcome = self.store.apply(
                self.session_id, replacements, reason=reason, config=cfg.to_json()
            )
            state.events.extend(outcome.events)
            if outcome.conflict:
                return "conflict"
            state.history_quiet = None if history_found else ctx.floor_waived
            applied = outcome.events
            fell = bool(applied) and applied[-1].tokens_after < applied[0].tokens_before
            return "progress" if fell else "stalled"
        return "stalled"

    def _build(
        self, snap: Snapshot, edits: Sequence[Edit], state: _CallState, reason: str
    ) -> list[Replacement]:
        if edits and edits[0].llm:
            # One strategy's edits are all LLM or all previews; only as many ranges as the
            # budget has calls left are loaded (S1, S4 and S5 plan every candidate).
            edits = edits[: max(0, self.config.max_llm_calls - state.llm_calls)]
        ids = [i for e in edits for i in e.replaced_ids]
        originals = self.store.load_messages(self.session_id, ids)
        out: list[Replacement] = []
        for edit in edits:
            msgs = [originals[i] for i in edit.replaced_ids]
            offload = uuid.uuid4()
            if not edit.llm:
                final = snap.messages[edit.start].final
                out.append(
                    Replacement(
                        edit, self._prepare(preview(msgs[0], self.config, offload), final), offload
                    )
                )
                continue
            state.llm_calls += 1
            replacement = self._summarise(snap, edit, msgs, offload, state, reason)
            if replacement is not None:
                out.append(replacement)
        return out

    def _summarise(
        self,
        snap: Snapshot,
        edit: Edit,
        msgs: list[Msg],
        offload: uuid.UUID,
        state: _CallState,
        reason: str,
    ) -> Replacement | None:
        prefix = ""
        to_summarise = msgs
        if edit.verbatim_prefix_id is not None:
            # Kept verbatim, its own tag included, so the older originals stay reachable.
            prefix = msgs[0].text.rstrip()
            to_summarise = msgs[1:]
        request = build_request(
            edit.strategy,
            to_summarise,
            prompts=self.config.prompts,
            char_budget=edit.char_budget,
            plan=state.plan,
        )
        try:
            pause_point("summarize.during")
            result = self.summarizer.summarize(request)
            text = check_answer(result.text)
        except SummarizerError as exc:
            self._fail(edit, state, reason, exc.reason, exc.detail)
            return None
        except Exception as exc:  # a caller's summariser may raise anything
            if self.config.strict:
                raise
            self._fail(edit, state, reason, "error", f"{type(exc).__name__}: {exc}")
            return None
        body = f"{prefix}\n\n{text}" if prefix else text
        if edit.strategy == 5:
            new_msg = summarised_payload(msgs[0], body, offload)
            final = snap.messages[edit.start].final
        else:
            new_msg = Msg.assistant(f"{body}\n{offload_tag(str(offload))}", kind=edit.new_kind)
            final = edit.new_kind == "round_summary"
        new = self._prepare(new_msg, final)
        replaced_tokens = edit.replaced_tokens
        if new.tokens >= replaced_tokens:
            self._fail(
                edit,
                state,
                reason,
                "no_gain",
                f"the summary has {new.tokens} tokens, not fewer than the {replaced_tokens} "
                "it would replace",
                model=result.model,
                prompt_tokens=result.prompt_tokens,
                completion_tokens=result.completion_tokens,
                latency_ms=result.latency_ms,
            )
            return None
        return Replacement(
            edit,
            new,
            offload,
            model=result.model,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            latency_ms=result.latency_ms,
        )

    def _fail(
        self,
        edit: Edit,
        state: _CallState,
        reason: str,
        why: str,
        detail: str,
        **usage: object,
    ) -> None:
        state.failed.add(edit.replaced_ids)
        if self.config.strict:
            raise SummarizerError(why, detail)
        logger.warning(
            "autoctx: session %r strategy %d failed (%s): %s",
            self.session_id,
            edit.strategy,
            why,
            detail,
        )
        event = self.store.record_event(
            self.session_id,
            strategy=edit.strategy,
            status="failed",
            reason=reason,
            replaced_ids=edit.replaced_ids,
            error=f"{why}: {detail}",
            config=self.config.to_json(),
            **usage,  # type: ignore[arg-type]
        )
        state.events.append(event)

    def _prepare(self, msg: Msg, final: bool) -> Prepared:
        return Prepared(msg, count_tokens(msg, self.counter), msg.payload_chars, final)


# ---------------------------------------------------------------------------------------------
# Replacement messages (pure)
# ---------------------------------------------------------------------------------------------


def _with_tag(text: str, offload: uuid.UUID) -> str:
    return f"{text}\n{offload_tag(str(offload))}"


def preview(msg: Msg, config: AutoContextConfig, offload: uuid.UUID) -> Msg:
    """S2/S3: the first `preview_chars` characters, '...', a newline and the tag.

    Role and name stay; a tool message keeps every result's call id and tool name (the tag goes
    on the last one).
    """
    n = config.preview_chars
    if msg.role == "tool":
        results = msg.tool_results
        blocks: list[Block] = []
        for k, r in enumerate(results):
            head = r.output_text[:n] + "..."
            if k == len(results) - 1:
                head = _with_tag(head, offload)
            blocks.append(ToolResultBlock(r.tool_use_id, head, r.name))
        return Msg("tool", tuple(blocks), name=msg.name, kind="preview")
    text = msg.text or _opaque_text(msg)
    return Msg(
        msg.role, (TextBlock(_with_tag(text[:n] + "...", offload)),), name=msg.name, kind="preview"
    )


def summarised_payload(msg: Msg, summary: str, offload: uuid.UUID) -> Msg:
    """S5: only the text/output is replaced; every tool_use and tool_result keeps its id and name.

    Large tool-call arguments become a small JSON object pointing at the offload, so the call
    stays valid JSON.
    """
    tagged = _with_tag(summary, offload)
    if msg.role == "tool":
        results = msg.tool_results
        last = results[-1].tool_use_id
        blocks: list[Block] = [
            ToolResultBlock(
                r.tool_use_id,
                tagged if k == len(results) - 1 else f"[summarised with the result of call {last}]",
                r.name,
            )
            for k, r in enumerate(results)
        ]
        return Msg("tool", tuple(blocks), name=msg.name, kind="large_summary")
    out: list[Block] = [TextBlock(tagged)]
    for b in msg.content:
        if isinstance(b, ToolUseBlock):
            args = b.arguments
            if len(args) > _LARGE_ARGUMENTS_CHARS:
                args = json.dumps({"offloaded_arguments": str(offload)})
            out.append(ToolUseBlock(b.id, b.name, args, b.extra))
    return Msg(msg.role, tuple(out), name=msg.name, kind="large_summary")


#: Tool-call arguments longer than this are replaced by a pointer to the offload in S5: the
#: call must stay valid JSON, and short arguments are worth keeping verbatim.
_LARGE_ARGUMENTS_CHARS = 256


def _opaque_text(msg: Msg) -> str:
    kinds = [str(b.data.get("type", "opaque")) for b in msg.content if isinstance(b, OpaqueBlock)]
    return "[" + ", ".join(kinds) + "]"
