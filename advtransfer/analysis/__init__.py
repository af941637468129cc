"""Analysis of finished run folders (results.parquet, samples/, adv/, manifest.json), in layers:

- :mod:`.runs`      reading a run folder (results with the defaults older runs lack, per-image tables,
                    the two joined) and writing the commands' CSV tables; damaged files are one-line errors
- :mod:`.stats`     paired statistics (pure): exact McNemar, Newcombe and bootstrap intervals, Holm, strata
- :mod:`.pooling`   image-pooled success rates and their image-bootstrap intervals
- :mod:`.measures`  what writes tables (and figures, through :func:`.plots.pyplot`):
                    comparisons, golden counts, mismatch and lineage, white-box matching, worst case,
                    SAT similarity from the run folder alone; minimal distortion, HopSkipJump, FiT and
                    knowledge transfer, which load the run's models
- :mod:`.report`    report.md / report.html / LaTeX tables: reads the tables and figures, renders, writes
                    only its own folder
- :mod:`.plots`     transfer-matrix heatmaps of a run, and the one way every figure is written

The commands that run them (compare, report, distortion, golden, dumb, lineage, knowledge,
whitebox-match, claims, measure) are modules of :mod:`advtransfer.cli`.

The analyses craft no transfer attack and change no grid result; two measures run an attack as a
yardstick of their own: ``measures.blackbox`` is HopSkipJump, a decision-based query attack on each
victim (the minimal distortion a black-box attacker finds), and ``measures.knowledge`` crafts
own-label PGD on zoo models through the attack registry (Liang et al.'s α1, α2). Both write tables
beside the run's (blackbox.parquet; knowledge.csv in the folder given), never into its results.
"""
