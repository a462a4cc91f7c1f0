"""Small SVG pictures for the dashboard, drawn on the server (the pages' CSP allows no script):
a test's outcomes as a strip of coloured cells, a batch's durations as a line. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

# outcome letter (contract.outcomes.Outcome) -> (colour, word)
OUTCOME_STYLE = {
    "p": ("#2da44e", "passed"),
    "f": ("#cf222e", "failed"),
    "e": ("#8250df", "error"),
    "s": ("#bf8700", "skipped"),
    "x": ("#57606a", "xfailed"),
    "X": ("#0969da", "xpassed"),
    "-": ("#eaeef2", "not run"),
}
CELL = 12
GAP = 2


@dataclass(frozen=True)
class Cell:
    outcome: str  # an Outcome letter, or "-"
    label: str  # the tooltip: which run, which commit


def outcome_strip(cells: Sequence[Cell]) -> Markup:
    """One cell per run, oldest on the left, each with its outcome as a tooltip."""
    width = max(len(cells) * (CELL + GAP), CELL)
    rects = []
    for i, cell in enumerate(cells):
        colour, word = OUTCOME_STYLE.get(cell.outcome, OUTCOME_STYLE["-"])
        rects.append(
            f'<rect x="{i * (CELL + GAP)}" y="0" width="{CELL}" height="{CELL * 2}" rx="2"'
            f' fill="{colour}"><title>{escape(word)}: {escape(cell.label)}</title></rect>'
        )
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="strip" width="{width}"'
        f' height="{CELL * 2}" role="img" aria-label="outcomes, oldest first">'
        + "".join(rects)
        + "</svg>"
    )


def duration_plot(
    points: Sequence[tuple[str, float]], width: int = 360, height: int = 80
) -> Markup:
    """The durations (label, seconds), oldest on the left, as a line with a dot per run and
    the longest one written at the top."""
    if not points:
        return Markup("")
    longest = max(seconds for _, seconds in points) or 1.0
    step = (width - 8) / max(len(points) - 1, 1)
    xy = [
        (4 + i * step, height - 14 - (seconds / longest) * (height - 28))
        for i, (_, seconds) in enumerate(points)
    ]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    dots = "".join(
        f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="#0969da">'
        f"<title>{escape(label)}: {seconds:.1f} s</title></circle>"
        for (x, y), (label, seconds) in zip(xy, points, strict=True)
    )
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{width}" height="{height}"'
        f' role="img" aria-label="duration per run, oldest first">'
        f'<text x="4" y="10" font-size="10" fill="#57606a">{longest:.1f} s</text>'
        f'<line x1="0" y1="{height - 14}" x2="{width}" y2="{height - 14}" stroke="#d0d7de"/>'
        f'<polyline points="{line}" fill="none" stroke="#0969da" stroke-width="1.5"/>'
        f"{dots}</svg>"
    )
