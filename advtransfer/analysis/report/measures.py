"""The report's section of registered measures (``advtransfer measure RUN NAME``): one table per
measure found in ``RUN/measures/``, its first rows as the measure wrote them, with its description
and, for a plugin's measure, the sha256 of the source that wrote it. Registered on import
(``report/core.py`` imports this module at its end); ``None`` when no measure has run."""
from __future__ import annotations

import math


from ..runs import measured, read_table
from .base import Block, ReportContext, Section, Table, register_section, tex_name

#: rows of a measure table the report shows (the whole table is RUN/measures/<name>.csv)
MAX_ROWS = 30


def _cell(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "—"
        return f"{v:.4g}"
    return str(v)


@register_section
def section_measures(ctx: ReportContext) -> Section | None:
    """One table per registered measure the run folder holds."""
    found = measured(ctx.run_dir)
    if not found:
        return None
    blocks: list[Block] = ["Tables of registered measures (`advtransfer measure RUN NAME`; "
                           "`advtransfer measure --list` lists them, plugins add their own)."]
    for rec, path in found:
        name = str(rec.get("measure", path.stem))
        df = read_table(path, f"advtransfer measure {ctx.run_dir} {name}")
        if df is None:
            continue
        src = f" Written by a plugin (source sha256 {str(rec['plugin_sha256'])[:12]})." if rec.get("plugin_sha256") else ""
        shown = df.head(MAX_ROWS)
        more = f"; first {MAX_ROWS} of {len(df)} rows, all in measures/{name}.csv" if len(df) > MAX_ROWS else ""
        blocks.append(f"**{name}**: {rec.get('description', '')}{src}")
        blocks.append(Table([str(c) for c in shown.columns],
                            [[_cell(v) for v in row] for row in shown.itertuples(index=False)],
                            caption=f"measure {name} ({len(df)} rows{more})", tex=f"measure_{tex_name(name)}"))
    return Section("Registered measures", blocks, anchor="measures")
