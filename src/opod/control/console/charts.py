"""Bar charts drawn on the server as inline SVG: no script, no chart library, readable by a screen reader as a table.

:func:`bar_chart` lays the bars out in a fixed view box (the SVG scales to its box in the page);
the template draws them, each bar titled with its label and value, and the same figures follow in
a table for readers who cannot see the chart.
"""

from __future__ import annotations

from dataclasses import dataclass

WIDTH = 720
HEIGHT = 220
LEFT = 56
"""Room for the axis's figures."""
BOTTOM = 28
"""Room for the bars' labels."""
TOP = 12


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    value: str
    show_label: bool


@dataclass(frozen=True, slots=True)
class Tick:
    y: float
    text: str


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    bars: list[Bar]
    ticks: list[Tick]
    baseline: float
    left: int


def _nice(top: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``top``: the axis's end."""
    if top <= 0:
        return 1.0
    scale = 1.0
    while scale * 10 <= top:
        scale *= 10
    while scale > top:
        scale /= 10
    for step in (1, 2, 5, 10):
        if step * scale >= top:
            return step * scale
    return 10 * scale


def bar_chart(points: list[tuple[str, float]], *, shown: str = "{:,.0f}") -> Chart:
    """``(label, value)`` pairs as bars, left to right; ``shown`` formats a value for its title and the axis."""
    plot_w, plot_h = WIDTH - LEFT - 8, HEIGHT - BOTTOM - TOP
    end = _nice(max((v for _, v in points), default=0.0))
    slot = plot_w / max(1, len(points))
    every = max(1, len(points) // 10)
    bars = []
    for i, (label, value) in enumerate(points):
        height = plot_h * (value / end) if end else 0.0
        bars.append(
            Bar(
                x=round(LEFT + i * slot + slot * 0.1, 1),
                y=round(TOP + plot_h - height, 1),
                width=round(slot * 0.8, 1),
                height=round(height, 1),
                label=label,
                value=shown.format(value),
                show_label=i % every == 0,
            )
        )
    ticks = [Tick(y=round(TOP + plot_h * (1 - f), 1), text=shown.format(end * f)) for f in (0.0, 0.5, 1.0)]
    return Chart(width=WIDTH, height=HEIGHT, bars=bars, ticks=ticks, baseline=TOP + plot_h, left=LEFT)
