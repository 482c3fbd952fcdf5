"""The HTML report's view model: the sections, tables, figures and cells the page template draws.

Built by `longeval.report.sections` from summary tables (pure), drawn by `templates/report.html.j2` through
Jinja's autoescaping (`longeval.report.html.build_page`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from longeval.stats.compare import Comparison

__all__ = ["Block", "Cell", "FigureBlock", "PairView", "Row", "Section", "TableBlock", "TextBlock"]


@dataclass(frozen=True)
class Cell:
    """One table cell; `key` becomes a `data-key` attribute so tools (and tests) can find a number."""

    text: str
    cls: str = ""
    title: str = ""
    key: str = ""
    href: str = ""


@dataclass(frozen=True)
class Row:
    cells: list[Cell]
    cls: str = ""


@dataclass(frozen=True)
class TableBlock:
    header: list[str]
    rows: list[Row]
    caption: str = ""
    id: str = ""
    note: str = ""
    kind: str = "table"


@dataclass(frozen=True)
class FigureBlock:
    name: str
    src: str
    """A `data:image/svg+xml;base64,...` URI: the figure travels inside the page."""
    alt: str
    caption: str = ""
    kind: str = "figure"


@dataclass(frozen=True)
class TextBlock:
    text: str
    kind: str = "text"


Block = TableBlock | FigureBlock | TextBlock


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    level: int = 2
    intro: str = ""
    blocks: list[Block] = field(default_factory=list)


@dataclass(frozen=True)
class PairView:
    """B compared with A: the comparison, or why there is none."""

    a: str
    b: str
    comparison: Comparison | None = None
    error: str = ""

