"""The report's document model and the hook other analyses use to add sections.

Kept apart from :mod:`advtransfer.analysis.report` (which renders and holds the core sections) so
that a module adding a section imports this one, and the report imports it, without a cycle.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Union

import pandas as pd

if TYPE_CHECKING:
    from ...grid.runspec import RunSpec


# --- document model ------------------------------------------------------------------------------
@dataclass
class Table:
    """A table of already formatted strings; ``tex`` names its LaTeX file (no extension)."""

    columns: list[str]
    rows: list[list[str]]
    caption: str = ""
    tex: str | None = None
    wrap: bool = False  # long values wrap in the HTML page instead of scrolling sideways

    @property
    def numeric(self) -> list[bool]:
        """Per column: every non-empty cell looks like a number (right-aligned); the first column never."""
        def num(v: str) -> bool:
            v = str(v).strip()
            return v == "" or v[0] in "0123456789+<∞—" + MINUS or v.startswith("n/a")
        return [i > 0 and all(num(r[i]) for r in self.rows) for i in range(len(self.columns))]


@dataclass
class Figure:
    """An image, ``src`` relative to the report folder."""

    src: str
    caption: str = ""


@dataclass
class Raw:
    """Ready-made content for the two formats."""

    markdown: str
    html: str


Block = Union[str, Table, Figure, Raw]


@dataclass
class Section:
    title: str
    blocks: list[Block] = field(default_factory=list)
    anchor: str = ""


@dataclass
class ReportContext:
    """What a section function may read: the run's tables (rates in [0, 1]) and folders."""

    run_dir: Path
    out_dir: Path
    results: pd.DataFrame
    manifest: dict
    comparisons: pd.DataFrame | None
    comparisons_note: str = ""

    @property
    def spec(self) -> "RunSpec":
        """What the run used (dataset, split, n, zoo size, ...): the manifest's resolved spec, or for
        a run from before it the raw grid file with the spec's defaults (:meth:`RunSpec.from_manifest`)."""
        from ...grid.runspec import RunSpec

        return RunSpec.from_manifest(self.manifest)

    def rel(self, path: Path) -> str:
        """``path`` relative to the report folder, with forward slashes (for md and html)."""
        return Path(os.path.relpath(Path(path).resolve(), self.out_dir.resolve())).as_posix()


SectionFn = Callable[[ReportContext], Union[Section, None]]

# ==== HOOK POINT: optional sections (e.g. "distortion") ============================================
# Another module appends a SectionFn here, or uses @register_section; they run after the core
# sections, in order. Keep each function pure: read ctx, return a Section (or None to skip).
OPTIONAL_SECTIONS: list[SectionFn] = []


def register_section(fn: SectionFn) -> SectionFn:
    """Decorator: add ``fn`` to :data:`OPTIONAL_SECTIONS` (once) and return it unchanged."""
    if fn not in OPTIONAL_SECTIONS:
        OPTIONAL_SECTIONS.append(fn)
    return fn
# ===================================================================================================


# --- formatting -------------------------------------------------------------------------------------
MINUS = "\u2212"


def matrix_table(df: pd.DataFrame, cell: Callable[[pd.DataFrame], str], caption: str, tex: str) -> Table:
    """A surrogate × victim table of ``df``'s rows: one row per surrogate, one column per victim
    (both sorted), each cell ``cell(rows of that pair)`` and empty where the pair has no row."""
    victims = sorted(df["victim"].unique())
    rows = []
    for sur, g in df.groupby("surrogate", sort=True):
        rows.append([str(sur)] + [cell(gv) if len(gv := g[g["victim"] == v]) else "" for v in victims])
    return Table(["surrogate", *victims], rows, caption, tex=tex_name(tex))


def signed(v: float, digits: int = 1) -> str:
    """``+1.2`` / ``−1.9`` (typographic minus); ``n/a`` for NaN."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    s = f"{v:+.{digits}f}"
    return s.replace("-", MINUS)


def pct(v: float, digits: int = 1) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.{digits}f}"


def format_p(p: float) -> str:
    """Two significant digits, ``< 0.001`` below that."""
    if p is None or math.isnan(p):
        return "n/a"
    if p < 0.001:
        return "< 0.001"
    return f"{p:.2g}" if p < 0.995 else "1"


def tex_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", s.replace("/", "-")).strip("-")


def html_escape(s: str) -> str:
    from markupsafe import escape

    return str(escape(s))
