"""Checks made before a run trains or writes anything: the device, the output folder, the data
and every value of the grid. Each failure is one :class:`UserError` line (the CLI exits 2).

:func:`preflight` runs :meth:`advtransfer.grid.GridSpec.validate` (every value of the spec) and
adds what needs the machine or the data: the device exists and is available and can run the
spec's precision, the executor's profile and package are there, the run folder can be written,
the data splits are readable with the right shapes, dtypes and labels, ``n``/``start`` lie within
the split, every cell's attack resolves with its parameters (names, types and ranges from the
attack's declared :class:`~advtransfer.attacks.params.Param` s) and passes its own
:meth:`~advtransfer.attacks.base.Attack.check` against the cell it will craft in (layer names
resolve in freshly built networks of the harness-trained surrogates, class indices lie within the
label set, training-image counts within the training split, a backward-path attack finds a site
to change), and trained checkpoints are intact. :func:`advtransfer.run.runner.run_grid` and
:func:`advtransfer.run.runner.plan_grid` run it themselves, so the Python API is as safe as the CLI.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import UserError

if TYPE_CHECKING:
    from ..attacks.params import CellView
    from ..grid import GridSpec
    from .context import RunContext

#: what a run folder may hold; a non-empty folder with none of these is not one
RUN_MARKERS = ("manifest.json", "results.parquet", "run.lock", "run.log", "adv", "shards", "samples")


def check_device(device: str, flag: str = "--device") -> str:
    """``device`` if torch knows it and this machine has it; else a one-line UserError."""
    import torch

    try:
        d = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise UserError(f"{flag} {device!r} is not a torch device; use cpu, cuda, cuda:N or mps") from None
    if d.type == "cpu":
        return device
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"{flag} {device!r}: no CUDA GPU is visible on this machine; use --device cpu")
        count = torch.cuda.device_count()
        if d.index is not None and d.index >= count:
            raise UserError(f"{flag} {device!r}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}")
        return device
    if d.type == "mps":
        if not torch.backends.mps.is_available():
            raise UserError(f"{flag} {device!r}: Apple MPS is not available here; use --device cpu")
        return device
    raise UserError(f"{flag} {device!r}: the harness runs on cpu, cuda or mps, not {d.type}")


def check_run_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """A folder the run may write: a run folder, an empty folder, or a path whose nearest existing
    parent is a writable folder (nothing is created here)."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise UserError(f"{flag} {str(p)!r} is a file, not a folder; give a folder path (it is created if missing)")
    q = p
    while not q.exists():
        if q.parent == q:
            break
        q = q.parent
    if not q.is_dir():
        raise UserError(f"{flag} {str(p)!r}: {str(q)!r} is a file, so the folder cannot be created there")
    if not os.access(q, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {str(p)!r}: {str(q)!r} is not writable; choose a folder you can write")
    if p.is_dir() and any(p.iterdir()) and not any((p / m).exists() for m in RUN_MARKERS):
        raise UserError(f"{flag} {str(p)!r} is a non-empty folder that is not a run folder; give a new or "
                        "empty folder (or an earlier run's folder to resume it)")
    return p


def check_split(ds, n: int, start: int, source: str) -> None:
    """The split's labels lie in its label set and ``start .. start+n-1`` within it."""
    import numpy as np

    y = np.asarray(ds.y)
    if y.ndim != 1 or len(y) != len(ds.x):
        raise UserError(f"{ds.name} {ds.split}: labels must be one per image ({len(y)} labels, {len(ds.x)} images)")
    k = len(ds.classes)
    if len(y) and (y.min() < 0 or y.max() >= k):
        raise UserError(f"{ds.name} {ds.split}: labels must lie in 0..{k - 1} (its {k} classes), "
                        f"found {int(y.min())}..{int(y.max())}; check the data folder")
    if start < 0 or n < 1 or start + n > len(y):
        raise UserError(f"{source}: images {start}..{start + n - 1} are outside the {len(y)} {ds.split} images; "
                        f"lower n (at most {max(0, len(y) - start)} from start {start})")


def cell_view(spec: "GridSpec", cell, specs: dict, ds, n_train: int | None, nets: dict) -> "CellView":
    """What an attack's :meth:`~advtransfer.attacks.base.Attack.check` sees of ``cell`` before any
    model trains: a freshly initialised network (architecture only, no weights) of each
    harness-trained surrogate member (None for pretrained or defended entries, built from their
    own code and checked when crafted), the dataset's classes and image shape, the training
    split's size. ``nets`` (model name → network) keeps the networks built for earlier cells."""
    from ..attacks.params import CellView
    from ..models import zoo

    members, archs = [], []
    for m in cell.surrogate.models:
        src = zoo.declared(zoo.get_spec(m, specs))
        if src.kind in ("trained", "collection"):
            if m not in nets:
                nets[m] = src.network(spec.size)
            members.append((m, nets[m]))
            archs.append((m, src.arch_name(spec.size)))
        else:
            members.append((m, None))
    shape = getattr(ds.x, "shape", None)  # an in-memory N×H×W×C array; an image folder squares to its size
    h, w, c = tuple(shape[1:]) if shape is not None else (ds.x.size, ds.x.size, 3)
    return CellView(networks=tuple(members), num_classes=len(ds.classes), image_shape=(c, h, w), n_train=n_train,
                    size=spec.size, archs=tuple(archs))


def preflight(spec: "GridSpec", ctx: "RunContext") -> None:
    """Every check a grid run makes before it trains a model or writes a file (see the module
    docstring), for ``spec`` run in ``ctx`` (its run folder, device, data, model cache and submitit
    profile)."""
    from ..core.accel import check_precision
    from ..data import load_dataset
    from .deadline import check_deadline
    from .executors import check_executor_setup
    from ..grid import expand_cells
    from ..models import zoo

    spec.validate()
    check_device(ctx.device)
    check_precision(spec.precision, ctx.device)
    check_executor_setup(spec.executor, ctx.profile)
    check_deadline(ctx.deadline, spec.executor)
    check_run_dir(ctx.run_dir)
    ds = load_dataset(spec.dataset, spec.split, ctx.data_dir)
    check_split(ds, spec.n, spec.start, spec.source)
    specs = zoo.load_specs()
    shas = {m: f"unchecked:{m}" for m in spec.model_names()}
    # every attack resolves first (parameter names, types, static ranges), as the grid expands
    cells = expand_cells(spec, shas)
    # what needs the cell (layers of the surrogates, classes of the data) before anything slower
    nets: dict = {}  # networks built for the checks, by model name
    _check_cells(spec, cells, specs, ds, None, nets)
    needs_training = False
    for m in spec.model_names():
        src = zoo.declared(zoo.get_spec(m, specs))
        if src.is_ready(spec.size, ctx.cache):
            src.check(spec.size, ctx.cache)  # a corrupt checkpoint is refused before anything runs
        elif src.trains:
            needs_training = True
    learners = [c for c in cells if any(p.within == "train_images" for p in c.resolved.declared().values())]
    if learners or needs_training:
        train = load_dataset(spec.dataset, "train", ctx.data_dir)
        check_split(train, 1, 0, spec.source)
        if learners:  # their training-image counts against the split, now that its size is known
            _check_cells(spec, learners, specs, ds, len(train), nets)


def _check_cells(spec: "GridSpec", cells: list, specs: dict, ds, n_train: int | None, nets: dict) -> None:
    """Each cell's attack's own check against the cell's :func:`cell_view`; a failure names the cell."""
    from ..grid import describe

    for cell in cells:
        try:
            cell.resolved.check(cell_view(spec, cell, specs, ds, n_train, nets))
        except UserError as e:
            raise UserError(f"{spec.source or spec.name}: {describe(cell)}: {e}") from None
