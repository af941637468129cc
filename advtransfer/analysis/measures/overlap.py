"""``fooled_overlap``, a registered measure (``advtransfer measure RUN fooled_overlap``): for each
cell and each pair of its victims, do the same adversarial images fool both?

Transfer rates alone cannot tell two victims that fall to the same images (one shared weakness)
from two that fall to disjoint ones (the union of the pair is then a much stronger threat than
either). Per pair, on the images both victims classify correctly when clean: ``n_both_correct``,
``n_a`` and ``n_b`` (fooled: ``success`` in the per-image table), ``n_both`` (fooled in both),
``jaccard`` = n_both / |fooled in a or b| (NaN when neither is fooled) and ``expected_both``, the
count of images fooled in both if the two victims fell independently at their rates
(n_a · n_b / n_both_correct): ``n_both`` above it means the same images fool both.
Reads the per-image tables only (no model is loaded)."""
from __future__ import annotations

import itertools
import math

import pandas as pd

from .registry import MeasureContext, register_measure


@register_measure("fooled_overlap", description="per cell and victim pair: images fooling both, Jaccard index and "
                                                "the count expected if the victims fell independently")
def fooled_overlap(ctx: MeasureContext) -> pd.DataFrame:
    """Per (cell, victim a, victim b), a < b by name: overlap of the images fooling each."""
    rows = []
    for cell in ctx.cells():
        s = ctx.samples(cell.cell_id)
        by_victim = {v: g.set_index("index") for v, g in s.groupby("victim", sort=True)}
        for a, b in itertools.combinations(sorted(by_victim), 2):
            ga, gb = by_victim[a], by_victim[b]
            common = ga.index.intersection(gb.index)
            ok = ga.loc[common, "clean_correct"].astype(bool) & gb.loc[common, "clean_correct"].astype(bool)
            idx = common[ok.to_numpy()]
            fa = ga.loc[idx, "success"].astype(bool).to_numpy()
            fb = gb.loc[idx, "success"].astype(bool).to_numpy()
            n, na, nb, both, either = len(idx), int(fa.sum()), int(fb.sum()), int((fa & fb).sum()), int((fa | fb).sum())
            rows.append({"cell_id": cell.cell_id, "surrogate": cell.surrogate, "attack_label": cell.attack_label,
                         "eps_str": cell.eps_str, "victim_a": a, "victim_b": b, "n_both_correct": n,
                         "n_a": na, "n_b": nb, "n_both": both,
                         "jaccard": both / either if either else math.nan,
                         "expected_both": na * nb / n if n else math.nan})
    return pd.DataFrame(rows, columns=["cell_id", "surrogate", "attack_label", "eps_str", "victim_a", "victim_b",
                                       "n_both_correct", "n_a", "n_b", "n_both", "jaccard", "expected_both"])
