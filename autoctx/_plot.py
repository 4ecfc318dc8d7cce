"""Working-context size over a session's life, rebuilt from what the database recorded.

Nothing stores a time series: it is reconstructed from the messages (each original adds its
tokens to the working context when appended) and the compression events (each applied event
moves the working totals from its `*_before` to its `*_after` figures). Message ids are
allocated per session in commit order, and the message a compression writes carries its event,
so walking the messages in id order replays the session exactly.

`render()` needs matplotlib (the ``plot`` extra), imported only when a plot is drawn.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal

from ._errors import AutoContextError
from ._events import Event
from ._store.inspect import MessageStamp
from ._strategies import registry

__all__ = [
    "STRATEGY_COLORS",
    "STRATEGY_NAMES",
    "Mark",
    "Point",
    "Series",
    "reconstruct",
    "render",
]

#: Short names and colours of the strategies, for legends and tables (their records:
#: `registry`, docs/design.md §3); 0 is a pop (`pop_last`, the SDK's pop_item).
STRATEGY_NAMES: Final[Mapping[int, str]] = registry.STRATEGY_NAMES
STRATEGY_COLORS: Final[Mapping[int, str]] = registry.STRATEGY_COLORS

XAxis = Literal["step", "time"]

#: Resolution of the saved PNG; marker sizes in pixels follow from it.
DPI: Final = 110


@dataclass(frozen=True, slots=True)
class Point:
    #: Originals appended so far (the agent's progress).
    step: int
    time: datetime | None
    tokens: int
    messages: int


@dataclass(frozen=True, slots=True)
class Mark:
    """One compression attempt, placed where it happened."""

    step: int
    time: datetime | None
    strategy: int
    status: str
    tokens_before: int
    tokens_after: int
    messages_before: int
    messages_after: int


@dataclass
class Series:
    points: list[Point] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)


def reconstruct(stamps: Sequence[MessageStamp], events: Sequence[Event]) -> Series:
    """The working totals after every append and every compression, in order.

    An applied event is replayed at the first message it wrote (a masking pass writes one per
    output); a pop that left nothing in place of the popped message wrote none, so it is
    replayed at its own time, like the attempts that changed nothing (failed, skipped,
    conflict), which are placed after the last original appended before them.
    """
    by_id = {e.id: e for e in events}
    written = {s.event_id for s in stamps if s.event_id is not None}
    # Applied events that wrote no message, in time order, replayed between the stamps.
    unwritten = sorted(
        (e for e in events if e.status == "applied" and e.id not in written),
        key=lambda e: (e.created_at is None, e.created_at or datetime.min, e.id),
    )
    series = Series([Point(0, stamps[0].created_at if stamps else None, 0, 0)])
    tokens = messages = step = 0
    original_times: list[datetime] = []
    replayed: set[int] = set()

    def replay(event: Event, at: datetime | None) -> None:
        nonlocal tokens, messages
        tokens, messages = event.tokens_after, event.messages_after
        series.marks.append(_mark(event, step, at))
        series.points.append(Point(step, at, tokens, messages))

    k = 0
    for s in stamps:
        while k < len(unwritten) and _before(unwritten[k].created_at, s.created_at):
            replay(unwritten[k], unwritten[k].created_at)
            k += 1
        event = by_id.get(s.event_id) if s.event_id is not None else None
        if event is None:
            tokens += s.tokens
            messages += 1
            step += 1
            original_times.append(s.created_at)
            series.points.append(Point(step, s.created_at, tokens, messages))
        elif event.id not in replayed:
            # A masking pass wrote a message for each output it masked: one mark, at the first.
            replayed.add(event.id)
            replay(event, s.created_at)
    for e in unwritten[k:]:
        replay(e, e.created_at)
    for e in events:
        if e.status != "applied" and e.created_at is not None:
            at = bisect.bisect_right(original_times, e.created_at)
            series.marks.append(_mark(e, at, e.created_at))
    series.marks.sort(key=lambda m: (m.step, m.status != "applied"))
    return series


def _before(a: datetime | None, b: datetime | None) -> bool:
    """Whether `a` comes strictly before `b` (an unknown time comes last)."""
    return a is not None and (b is None or a < b)


def _mark(e: Event, step: int, at: datetime | None) -> Mark:
    return Mark(
        step,
        at,
        e.strategy,
        e.status,
        e.tokens_before,
        e.tokens_after,
        e.messages_before,
        e.messages_after,
    )


def _clusters(points: Sequence[tuple[float, float]], radius: float) -> list[list[int]]:
    """Indices of `points` grouped so that two points closer than `radius` share a group
    (single linkage): every pair from different groups is at least `radius` apart."""
    parent = list(range(len(points)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    order = sorted(range(len(points)), key=lambda i: points[i][0])
    for a, i in enumerate(order):
        xi, yi = points[i]
        for j in order[a + 1 :]:
            xj, yj = points[j]
            if xj - xi >= radius:
                break
            if (xj - xi) ** 2 + (yj - yi) ** 2 < radius**2:
                parent[root(j)] = root(i)
    groups: dict[int, list[int]] = {}
    for i in range(len(points)):
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values(), key=lambda g: points[g[0]][0])


def _merge_overlapping(ax: Any, collection: Any) -> None:
    """Replace the markers of `collection` that would touch one another by one marker, at the
    highest of them (where a cascade of compressions began), labelled with how many it
    stands for; a lone marker stays as it is.

    A strategy that fires several times in a row at one step (S5 working through a backlog of
    large messages) would otherwise draw a column of overlapping markers that cannot be
    counted.
    """
    offsets = collection.get_offsets()
    if len(offsets) < 2:
        return
    sizes = collection.get_sizes()
    # Marker area is in points squared; its diameter in pixels at the figure's resolution
    # (the one it is saved at, so what is apart here is apart in the PNG).
    diameter = (float(max(sizes)) ** 0.5) * ax.figure.dpi / 72.0
    shown = ax.transData.transform(offsets)
    pixels = [(float(px), float(py)) for px, py in shown]
    groups = _clusters(pixels, 2 * diameter)
    if len(groups) == len(pixels):
        return
    from matplotlib.patheffects import withStroke

    keep = [max(g, key=lambda i: pixels[i][1]) for g in groups]
    collection.set_offsets(offsets[keep])
    if len(sizes) > 1:
        collection.set_sizes(sizes[keep])
    for group, i in zip(groups, keep, strict=True):
        if len(group) > 1:
            ax.annotate(
                f"x{len(group)}",
                xy=(offsets[i][0], offsets[i][1]),
                xytext=(diameter * 0.45 + 1, 2),
                textcoords="offset pixels",
                fontsize=7,
                color="#222222",
                gid="autoctx-count",
                # A white halo keeps the count legible where it crosses the curve.
                path_effects=[withStroke(linewidth=2, foreground="white")],
            )


def _pyplot_free_figure() -> Any:
    # The Figure class needs no GUI backend, so plotting never touches the caller's
    # matplotlib state (pyplot would pick or switch a global backend).
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise AutoContextError(
            "plotting needs matplotlib, which is not installed; install the extra with "
            "`pip install 'autoctx-pg[plot]'` (in a checkout: `pip install -e '.[plot]'`)"
        ) from None
    return Figure(figsize=(13, 7.5), dpi=DPI, layout="constrained")


def render(
    series: Series,
    config: Mapping[str, Any],
    out: str | Path,
    *,
    title: str,
    x: XAxis = "step",
) -> Path:
    """Draw tokens (top) and messages (bottom) of the working context; save a PNG to `out`.

    `config` is the session's recorded thresholds (`max_tokens`, `token_ratio`, `target_ratio`,
    `msg_threshold`). Compressions are marked by strategy; failed attempts with a cross.
    """
    fig = _pyplot_free_figure()
    ax_tok, ax_msg = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1.4))
    xs: list[Any] = [p.step if x == "step" else p.time for p in series.points]
    max_tokens = int(config["max_tokens"])
    # The triggers are shares of the window less what each call reserves (docs/design.md §2).
    room = max_tokens - int(config.get("reserve_tokens", 0))
    trigger = room * float(config["token_ratio"])
    target = room * float(config["target_ratio"])
    # None: no count trigger (the default), so no lines on the message axis.
    msg_threshold = config.get("msg_threshold")

    ax_tok.plot(
        xs,
        [p.tokens for p in series.points],
        drawstyle="steps-post",
        color="#333333",
        linewidth=1.1,
        label="working tokens",
    )
    ax_tok.axhline(max_tokens, color="#777777", linewidth=1, label=f"window {max_tokens:,}")
    ax_tok.axhline(
        trigger,
        color="#C0392B",
        linestyle="--",
        linewidth=1.2,
        label=f"trigger {trigger:,.0f} ({config['token_ratio']} x window)",
    )
    ax_tok.axhline(
        target,
        color="#27AE60",
        linestyle=":",
        linewidth=1.4,
        label=f"target {target:,.0f} ({config['target_ratio']} x window)",
    )

    ax_msg.plot(
        xs,
        [p.messages for p in series.points],
        drawstyle="steps-post",
        color="#333333",
        linewidth=1.1,
    )
    if msg_threshold is not None:
        ax_msg.axhline(
            int(msg_threshold),
            color="#C0392B",
            linestyle="--",
            linewidth=1.2,
            label=f"trigger {msg_threshold} messages",
        )
        ax_msg.axhline(
            int(msg_threshold) * float(config["target_ratio"]),
            color="#27AE60",
            linestyle=":",
            linewidth=1.4,
            label=f"target {int(msg_threshold) * float(config['target_ratio']):.0f} messages",
        )

    for strategy in sorted({m.strategy for m in series.marks}):
        applied = [m for m in series.marks if m.strategy == strategy and m.status == "applied"]
        if applied:
            mx = [m.step if x == "step" else m.time for m in applied]
            color = STRATEGY_COLORS.get(strategy, "black")
            ax_tok.scatter(
                mx,
                [m.tokens_before for m in applied],
                marker="v",
                s=34,
                zorder=3,
                color=color,
                edgecolors="#222222",
                linewidths=0.5,
                label=f"S{strategy} {STRATEGY_NAMES.get(strategy, '')} ({len(applied)})",
            )
            ax_msg.scatter(
                mx,
                [m.messages_before for m in applied],
                marker="v",
                s=22,
                zorder=3,
                color=color,
                edgecolors="#222222",
                linewidths=0.5,
            )
    failed = [m for m in series.marks if m.status != "applied"]
    if failed:
        ax_tok.scatter(
            [m.step if x == "step" else m.time for m in failed],
            [m.tokens_before for m in failed],
            marker="x",
            s=30,
            color="#555555",
            zorder=3,
            label=f"failed / conflict ({len(failed)})",
        )

    from matplotlib.ticker import StrMethodFormatter

    ax_tok.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax_tok.set_title(title)
    ax_tok.set_ylabel("tokens in the working context")
    top = max([p.tokens for p in series.points] + [max_tokens])
    ax_tok.set_ylim(0, top * 1.08)
    ax_tok.grid(True, alpha=0.25)
    # Outside the axes: the curve fills the whole plot area sooner or later.
    ax_tok.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, framealpha=0.9)
    ax_msg.set_ylabel("messages")
    ax_msg.set_ylim(
        0, max([p.messages for p in series.points] + [int(msg_threshold or 0), 1]) * 1.15
    )
    ax_msg.grid(True, alpha=0.25)
    ax_msg.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, framealpha=0.9)
    ax_msg.set_xlabel("original messages appended" if x == "step" else "time (UTC)")

    path = Path(out)
    # Markers that would overlap can only be found once the layout fixed every axis' pixels.
    fig.draw_without_rendering()
    for ax in (ax_tok, ax_msg):
        ax.set_xlim(ax.get_xlim())
        ax.set_ylim(ax.get_ylim())
        for collection in list(ax.collections):
            _merge_overlapping(ax, collection)
    fig.savefig(path, dpi=DPI)
    return path
