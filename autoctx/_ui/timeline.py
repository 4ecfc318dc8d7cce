"""The token timeline of one session as an inline SVG, drawn server-side (no script, no asset).

The x axis is the session's version (every append and every compression bumps it, so it counts
the session's steps); the y axis is the working context's tokens. Each compression event is a
point before and after it (the line drops where one applied), marked in its strategy's color; a
failed attempt is a red cross. The window, the trigger and the target are horizontal lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Final

from .._store.console import TimelinePoint
from .._strategies import registry

WIDTH: Final = 960
HEIGHT: Final = 300
_LEFT: Final = 64
_RIGHT: Final = 16
_TOP: Final = 16
_BOTTOM: Final = 36
_FAILED: Final = "#d62728"


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


def render(
    points: Sequence[TimelinePoint],
    *,
    tokens_now: int,
    version_now: int,
    limits: Limits,
    event_href: str,
) -> str:
    """The SVG element. `event_href` is a format string of an event's link: `{id}` is the
    event's id, `{prev}` the id before it (where a page that starts at the event begins)."""
    xs_max = max([version_now, *(p.version for p in points), 1])
    ys = [tokens_now, *(p.tokens_before for p in points), *(p.tokens_after for p in points)]
    ys += [v for v in (limits.window, limits.trigger, limits.target) if v]
    y_max = max(max(ys) * 1.05, 1.0)
    plot_w = WIDTH - _LEFT - _RIGHT
    plot_h = HEIGHT - _TOP - _BOTTOM

    def x(version: float) -> float:
        return _LEFT + plot_w * version / xs_max

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
        f"session version (steps), 0 to {xs_max:,}</text>"
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
    line: list[tuple[float, float]] = [(x(0), y(0))]
    for p in points:
        line.append((x(p.version), y(p.tokens_before)))
        if p.status == "applied":
            line.append((x(p.version), y(p.tokens_after)))
    line.append((x(version_now), y(tokens_now)))
    path = " ".join(f"{a:.1f},{b:.1f}" for a, b in line)
    out.append(f'<polyline points="{path}" fill="none" stroke="#333" stroke-width="1.2"/>')
    for p in points:
        title = (
            f"event {p.event_id}: {registry.event_label(p.strategy, p.reason)}, "
            f"{p.status} ({p.reason}), "
            f"{p.tokens_before:,} -> {p.tokens_after:,} tokens"
        )
        href = escape(event_href.format(id=p.event_id, prev=p.event_id - 1))
        if p.status == "failed":
            cx, cy = x(p.version), y(p.tokens_before)
            mark = (
                f'<path class="mark mark-failed" d="M{cx - 4:.1f},{cy - 4:.1f}L{cx + 4:.1f},'
                f'{cy + 4:.1f}M{cx - 4:.1f},{cy + 4:.1f}L{cx + 4:.1f},{cy - 4:.1f}" '
                f'stroke="{_FAILED}" stroke-width="2"/>'
            )
        else:
            color = registry.STRATEGY_COLORS.get(p.strategy, "#777")
            mark = (
                f'<circle class="mark mark-s{p.strategy}" cx="{x(p.version):.1f}" '
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
