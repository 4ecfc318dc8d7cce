"""The token timeline of one session as an inline SVG, drawn server-side (no script, no asset).

The x axis counts the session's steps (every append and every applied event is one, as the
session's version counts them); the y axis is the working context's tokens. The line is drawn
in steps, as the context moved: each append a rise (appends are summed into at most one step
per pixel column), each compression a drop, nothing interpolated between two events.

Two kinds of total are told apart. The **working context** (the solid line) is what a read of
the memory sends the model. The total **stored just before a compression** (dotted, grey) is
the one an append left and the ladder compressed before anything read it: it may pass the
window (an append of a large tool output does), and that is not an overflow, so it is never
drawn as one. A working context over the window that no compression followed (the next step was
another append: nothing compressed it before a read) is an overflow, and is marked in red.

Each compression event is marked in its strategy's color at the total it left; a failed attempt
is a red cross. The window, the trigger and the target are horizontal lines.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Final

from .._store.console import Growth, TimelinePoint
from .._strategies import registry

WIDTH: Final = 960
HEIGHT: Final = 300
_LEFT: Final = 64
_RIGHT: Final = 16
_TOP: Final = 16
_BOTTOM: Final = 36
_FAILED: Final = "#d62728"
#: Steps the appends are summed into at most (one per pixel column of the plot), whatever
#: the session's length.
BUCKETS: Final = WIDTH - _LEFT - _RIGHT
#: Events an event's link shows before it on the events page.
CONTEXT_EVENTS: Final = 5


@dataclass(frozen=True, slots=True)
class Limits:
    """The session's thresholds in tokens (None when its config has no window)."""

    window: int | None
    trigger: int | None
    target: int | None


def _fmt(tokens: float) -> str:
    if tokens >= 1_000_000:
        return f"{tokens / 1_000_000:.1f}M"
    if tokens >= 1_000:
        return f"{tokens / 1_000:.0f}k"
    return f"{tokens:.0f}"


@dataclass(frozen=True, slots=True)
class State:
    """The working context after one step: at step `x`, `tokens` tokens. `compressed` when the
    next step was a compression of the ladder (so nothing read this total)."""

    x: int
    tokens: int
    compressed: bool = False


@dataclass(frozen=True, slots=True)
class Drawing:
    """The states in order, and where each event is marked: event id -> (step, tokens)."""

    states: list[State]
    marks: dict[int, tuple[int, int]]


def states(points: Sequence[TimelinePoint], growth: Sequence[Growth]) -> Drawing:
    """The steps the working context took: the appends between events (each summed bucket a
    step of as many appends) and the applied events, in order. An event's own totals are the
    truth at its step: the total before it replaces what the appends summed to (an erasure, or
    an append racing an event, can make them differ). An applied event is marked at the total
    it left; a failed one on the total it found."""
    out = [State(0, 0)]
    marks: dict[int, tuple[int, int]] = {}
    buckets = iter(growth)
    pending = next(buckets, None)
    for index in range(len(points) + 1):
        while pending is not None and pending.events <= index:
            last = out[-1]
            out.append(State(last.x + pending.appends, last.tokens + pending.tokens))
            pending = next(buckets, None)
        if index == len(points):
            break
        p = points[index]
        last = out[-1]
        if p.status != "applied":
            marks[p.event_id] = (last.x, last.tokens)
            continue
        # A rung of the ladder (strategy 1 and up) compressed the total before anything read
        # it; a pop, clear, fork or erasure (strategy 0) acted on a total that was read.
        out[-1] = State(last.x, p.tokens_before, compressed=p.strategy > 0)
        out.append(State(last.x + 1, p.tokens_after))
        marks[p.event_id] = (out[-1].x, p.tokens_after)
    return Drawing(out, marks)


def _steps(path: Sequence[tuple[float, float]]) -> str:
    """An SVG path through the points, each move horizontal then vertical (a staircase)."""
    if not path:
        return ""
    out = [f"M{path[0][0]:.1f},{path[0][1]:.1f}"]
    for (x0, y0), (x1, y1) in itertools.pairwise(path):
        if x1 != x0:
            out.append(f"H{x1:.1f}")
        if y1 != y0:
            out.append(f"V{y1:.1f}")
    return "".join(out)


def render(
    points: Sequence[TimelinePoint],
    growth: Sequence[Growth],
    *,
    tokens_now: int,
    version_now: int,
    limits: Limits,
    event_href: str,
) -> str:
    """The SVG element. `event_href` is a format string of an event's link: `{id}` is the
    event's id, `{after}` the id its page begins after (`CONTEXT_EVENTS` before it, so that
    the event is seen among the ones around it, never alone on a one-row page)."""
    drawing = states(points, growth)
    drawn = drawing.states
    end = State(max(version_now, drawn[-1].x), tokens_now)
    xs_max = max(end.x, 1)
    ys = [end.tokens, *(s.tokens for s in drawn)]
    ys += [v for v in (limits.window, limits.trigger, limits.target) if v]
    y_max = max(max(ys) * 1.05, 1.0)
    plot_w = WIDTH - _LEFT - _RIGHT
    plot_h = HEIGHT - _TOP - _BOTTOM

    def x(step: float) -> float:
        return _LEFT + plot_w * step / xs_max

    def y(tokens: float) -> float:
        return _TOP + plot_h * (1 - tokens / y_max)

    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" '
        'aria-label="working tokens over the session, compressions marked">',
        f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" fill="#fafafa" '
        'stroke="#ccc"/>',
    ]
    for k in range(5):
        tokens = y_max * k / 4
        out.append(
            f'<text x="{_LEFT - 6}" y="{y(tokens) + 4:.1f}" text-anchor="end" '
            f'class="axis">{_fmt(tokens)}</text>'
        )
    out.append(
        f'<text x="{_LEFT + plot_w / 2}" y="{HEIGHT - 6}" text-anchor="middle" class="axis">'
        f"session steps (appends and compressions), 0 to {xs_max:,}</text>"
    )
    for name, value, color in (
        ("window", limits.window, "#d62728"),
        ("trigger", limits.trigger, "#ff7f0e"),
        ("target", limits.target, "#2ca02c"),
    ):
        if value:
            yy = y(value)
            out.append(
                f'<line class="limit limit-{name}" x1="{_LEFT}" x2="{_LEFT + plot_w}" '
                f'y1="{yy:.1f}" y2="{yy:.1f}" stroke="{color}" stroke-dasharray="6 4"/>'
                f'<text x="{_LEFT + plot_w - 4}" y="{yy - 4:.1f}" text-anchor="end" '
                f'fill="{color}" class="axis">{name} {value:,}</text>'
            )
    # The working context: every state a read could see, in steps; a total a compression
    # took before any read is left out of it (the line holds the level before, then drops).
    sent = [s for s in drawn if not s.compressed] + [end]
    stored: list[str] = []
    for k, s in enumerate(drawn):
        if s.compressed:
            before = drawn[k - 1].tokens if k else 0
            after = drawn[k + 1] if k + 1 < len(drawn) else end
            stored.append(
                f"M{x(s.x):.1f},{y(before):.1f}V{y(s.tokens):.1f}H{x(after.x):.1f}"
                f"V{y(after.tokens):.1f}"
            )
    if stored:
        out.append(
            f'<path class="stored" d="{"".join(stored)}" fill="none" stroke="#999" '
            'stroke-width="1" stroke-dasharray="2 2"><title>stored just before a compression, '
            "which ran before any read: never sent to the model</title></path>"
        )
    out.append(
        f'<path class="sent" d="{_steps([(x(s.x), y(s.tokens)) for s in sent])}" fill="none" '
        'stroke="#333" stroke-width="1.2"><title>the working context: what a read sends the '
        "model</title></path>"
    )
    if limits.window:
        # Over the window with no compression after it: a read there was sent too much.
        for a, b in itertools.pairwise(sent):
            if a.tokens > limits.window and b.x > a.x:
                out.append(
                    f'<circle class="overflow" cx="{x(a.x):.1f}" cy="{y(a.tokens):.1f}" r="3" '
                    f'fill="{_FAILED}"><title>{a.tokens:,} tokens over the '
                    f"{limits.window:,}-token window, and no compression before the next "
                    "step: an overflow</title></circle>"
                )
    for p in points:
        level_x, level = drawing.marks[p.event_id]
        title = (
            f"event {p.event_id}: {registry.event_label(p.strategy, p.reason)}, "
            f"{p.status} ({p.reason}), "
            f"{p.tokens_before:,} -> {p.tokens_after:,} tokens"
        )
        href = escape(
            event_href.format(id=p.event_id, after=max(p.event_id - CONTEXT_EVENTS - 1, 0))
        )
        cx = x(level_x)
        if p.status == "failed":
            cy = y(level)
            mark = (
                f'<path class="mark mark-failed" d="M{cx - 4:.1f},{cy - 4:.1f}L{cx + 4:.1f},'
                f'{cy + 4:.1f}M{cx - 4:.1f},{cy + 4:.1f}L{cx + 4:.1f},{cy - 4:.1f}" '
                f'stroke="{_FAILED}" stroke-width="2"/>'
            )
        else:
            color = registry.STRATEGY_COLORS.get(p.strategy, "#777")
            mark = (
                f'<circle class="mark mark-s{p.strategy}" cx="{cx:.1f}" '
                f'cy="{y(p.tokens_after):.1f}" r="3.5" fill="{color}" stroke="#333" '
                'stroke-width="0.5"/>'
            )
        out.append(f'<a href="{href}"><title>{escape(title)}</title>{mark}</a>')
    out.append("</svg>")
    return "".join(out)


def legend(points: Sequence[TimelinePoint]) -> list[tuple[str, str, int]]:
    """(label, color, count) of each kind of event that has an applied one (each rung, and a
    pop, clear, fork or erasure by its name), and of failures."""
    counts: dict[tuple[int, str], int] = {}
    failed = 0
    for p in points:
        if p.status == "failed":
            failed += 1
        elif p.status == "applied":
            kind = (p.strategy, registry.event_label(p.strategy, p.reason))
            counts[kind] = counts.get(kind, 0) + 1
    rows = [
        (name, registry.STRATEGY_COLORS.get(s, "#777"), n)
        for (s, name), n in sorted(counts.items())
    ]
    if failed:
        rows.append(("failed", _FAILED, failed))
    return rows
