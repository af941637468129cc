"""Measures: each reads a run folder (and, where it says so, loads the run's models) and writes
its own tables beside the run's (figures through :func:`advtransfer.analysis.plots.pyplot`).

From the run folder alone: :mod:`.compare` (paired comparisons), :mod:`.golden` (regression
counts), :mod:`.mismatch` (DUMB cases, lineage), :mod:`.whitebox_match`, :mod:`.exposure` (worst
case over attacks, ASR vs ε), :mod:`.similarity` (SAT). Loading models: :mod:`.distortion`
(minimal distortion along each transfer direction), :mod:`.blackbox` (HopSkipJump, a query attack
used as a yardstick), :mod:`.fit` (FiT source selection), :mod:`.knowledge` (α1, α2 with own-label PGD).

Registered measures (:mod:`.registry`): a function of a run folder returning one table, run by
``advtransfer measure RUN NAME`` into ``RUN/measures/`` and shown by the report; plugins add their
own with :func:`register_measure`. The harness registers :mod:`.overlap` (``fooled_overlap``).
"""
from .registry import MEASURES, Measure, MeasureContext, measure_names, register_measure, run_measure
from . import overlap  # noqa: E402,F401  (registers fooled_overlap)

__all__ = ["MEASURES", "Measure", "MeasureContext", "measure_names", "register_measure", "run_measure"]
