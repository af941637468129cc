"""The bottom layer: what every other layer uses and which imports no other part of the package
(only each other, and ``advtransfer.__version__``).

- :mod:`.errors`     :class:`UserError`, the one-line error the CLI prints (exit code 2)
- :mod:`.registry`   name -> object registries with suggestions for unknown names
- :mod:`.config`     every environment variable the package reads (:data:`~.config.ENVIRONMENT`)
- :mod:`.resources`  where the shipped grids, catalogues and zoo are (checkout or installed copy)
- :mod:`.rng`        seeded work without touching torch's global random state
- :mod:`.schema`     the result tables' columns
- :mod:`.utils`      fractions like 8/255, hashing, atomic writes, provenance
- :mod:`.metrics`    pure functions on tensors: success counts, distortions, Wilson intervals
- :mod:`.accel`      precision, compilation and out-of-memory batch halving (change no algorithm)
- :mod:`.faults`     kill and fail points for the interruption tests
- :mod:`.lock`       one writer per folder (a run folder, a model being trained)

Nothing is imported here: ``import advtransfer.core`` stays cheap.
"""
