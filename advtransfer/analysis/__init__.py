"""Analysis of finished run folders (reads results.parquet, samples/ and manifest.json; never crafts).

- :mod:`.stats`   paired statistics: exact McNemar, Newcombe and bootstrap intervals, Holm, strata
- :mod:`.compare` attack-vs-baseline and run-vs-run comparisons -> comparisons.parquet/.csv, forest plots
- :mod:`.report`  report.md / report.html / LaTeX tables of a run
"""
