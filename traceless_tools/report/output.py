"""The tail every benchmark, attack and audit ends with: print the table, write the JSON, draw the
plot. One place, so every tool's outputs look and behave alike."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def write_json(path: str | Path | None, report: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=2) + "\n")


def finish(
    report: dict,
    print_report: Callable[[dict], None],
    json_path: str | Path | None = None,
    plot: Callable[[dict, str], None] | None = None,
    plot_path: str | None = None,
) -> dict:
    """Print `report` as its table, write it as JSON and plot it, each where asked; returns it."""
    print_report(report)
    write_json(json_path, report)
    if plot is not None and plot_path:
        plot(report, plot_path)
    return report


@contextmanager
def figure(path: str | Path, size: tuple[float, float], **subplots: Any) -> Iterator[tuple[Any, Any]]:
    """(fig, axes) of a fresh matplotlib figure on the Agg backend; saved to `path` (120 dpi, tight
    layout) and closed when the block ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(figsize=size, **subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
