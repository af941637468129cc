"""The run layer: a grid run from its preflight to its merged tables.

- :mod:`.context`     the run context: a run's folder, model cache, data, device, threads, as one value
- :mod:`.validate`    the preflight: every check made before a run trains or writes anything
- :mod:`.runner`      a grid run: train the zoo, lock the folder, manifest, run the cells, merge
- :mod:`.executors`   who runs the cells: serially here, local worker processes, submitit/Slurm
- :mod:`.deadline`    stop at a cell boundary before a time limit (``grid --deadline``)
- :mod:`.cellrunner`  one cell end to end in whatever process runs it: models, cached examples, files
- :mod:`.cell`        one cell as pure functions: craft once, evaluate any victims
- :mod:`.store`       the run folder's files (the analysis layer reads run folders through it)
- :mod:`.pack`        a run folder without its adversarial examples, to go on elsewhere (``advtransfer pack``)

It uses attacks/, models/, grid/, data/ and core/, never analysis/ or cli/. Nothing is imported
here: ``import advtransfer.run`` stays cheap.
"""
