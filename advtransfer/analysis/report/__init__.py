"""The report of a run folder: reads the tables and figures the grid and the measures wrote and
renders them (report.md, report.html, LaTeX tables); it computes no new table and writes nothing
into the run folder but its own report/ folder.

- :mod:`.base`        blocks (Table, Figure, Raw), Section, ReportContext, number formats, the section registry
- :mod:`.core`        the core sections, the Markdown/HTML/LaTeX renderers and :func:`build_report`
- :mod:`.distortion`  sections of ``advtransfer distortion``'s tables (registered on import)
- :mod:`.generative`  sections of generative and multi-target runs (registered on import)
"""
from .base import Block, Figure, Raw, ReportContext, Section, SectionFn, Table, register_section
from .core import build_report, comparison_sentence, read_comparisons

__all__ = ["Block", "Figure", "Raw", "ReportContext", "Section", "SectionFn", "Table", "build_report",
           "comparison_sentence", "read_comparisons", "register_section"]
