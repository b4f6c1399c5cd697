"""What every benchmark's report writes with: markdown tables, cells for missing values, and the plots' saving."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

DASH = "—"


def md_table(header: list[str], body: list[list[str]]) -> list[str]:
    """A markdown table's lines; a ``|`` inside a cell is escaped."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
    return lines


def ms(seconds: float | None, signed: bool = False) -> str:
    """Seconds as milliseconds with two decimals (a sign when ``signed``); a dash for nothing measured."""
    if seconds is None or math.isnan(seconds):
        return DASH
    return f"{seconds * 1000:+.2f}" if signed else f"{seconds * 1000:.2f}"


def num(value: float | None, digits: int = 0) -> str:
    return DASH if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def percent(value: float | None) -> str:
    return DASH if value is None or math.isnan(value) else f"{value:.1%}"


def save_figure(fig: Any, ax: Any, path: Path, legend_size: int) -> Path:
    """Grid, legend (when anything was drawn), then the PNG; the figure is closed."""
    import matplotlib.pyplot as plt

    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
