"""Measures the user registers: a function of a finished run folder that returns one table.

A plugin (``advtransfer --plugin my_measures.py``, a grid's ``plugins:``, or the
``advtransfer.plugins`` entry-point group) registers a measure with :func:`register_measure`::

    from advtransfer.analysis.measures import MeasureContext, register_measure

    @register_measure("mean_margin", description="mean clean-class logit margin on the adversarial images")
    def mean_margin(ctx: MeasureContext) -> pd.DataFrame:
        rows = []
        for cell in ctx.cells():                      # one row per cell of the results table
            x, x_adv, y, index = ctx.images(cell.cell_id)  # pixels in [0,1], (N, C, H, W); (N,) each
            for victim in ctx.victims(cell.cell_id):
                logits = ctx.model(victim)(x_adv)     # the victim as the run evaluated it
                ...
                rows.append({"cell_id": cell.cell_id, "victim": victim, "margin": m})
        return pd.DataFrame(rows)

``advtransfer measure RUN mean_margin --plugin my_measures.py`` runs it and writes
``RUN/measures/mean_margin.parquet`` and ``.csv`` (atomically) with ``RUN/measures/mean_margin.json``
(the measure's name, description, its plug-in source's sha256 and the rows' count); ``advtransfer
report RUN`` then shows each measure table in a section of its own. A measure that returns
anything but a DataFrame, or raises, writes nothing: the command says which measure failed and why.
Rerunning a measure replaces its table (measures are cheap to rerun and their code may have changed:
the sha256 in the json says which source wrote the table).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import pandas as pd
import torch
from torch import nn

from ...core.errors import UserError
from ...core.registry import Registry
from ...core.utils import atomic_path
from ..runs import MEASURES_DIR

if TYPE_CHECKING:
    from ...grid.runspec import RunSpec


@dataclass(frozen=True)
class Measure:
    """A registered measure: ``fn(ctx) -> DataFrame``; ``loads_models``: whether it evaluates the
    run's models (the command then needs the zoo; a run-folder-only measure does not)."""

    name: str
    fn: Callable[["MeasureContext"], pd.DataFrame]
    description: str = ""
    loads_models: bool = False


MEASURES: Registry[Measure] = Registry("measure")


def register_measure(name: str, description: str = "", loads_models: bool = False
                     ) -> Callable[[Callable[["MeasureContext"], pd.DataFrame]], Callable[["MeasureContext"], pd.DataFrame]]:
    """Decorator: register ``fn(ctx: MeasureContext) -> pandas.DataFrame`` as measure ``name``
    (``advtransfer measure RUN name``). The function is returned unchanged."""

    def deco(fn: Callable[[MeasureContext], pd.DataFrame]) -> Callable[[MeasureContext], pd.DataFrame]:
        doc = (fn.__doc__ or "").strip().splitlines()
        MEASURES.add(name, Measure(name, fn, description or (doc[0] if doc else ""), loads_models))
        return fn

    return deco


@dataclass
class MeasureContext:
    """What a measure reads: the run's results table (one row per cell × victim; rates in [0, 1]),
    its manifest, per-image tables, cached adversarial images and the run's models.

    ``device``, ``cache`` (the model cache folder or None for the default) and ``data_dir`` (the
    dataset folder or None for ``$ADVTRANSFER_DATA``) are the command's."""

    run_dir: Path
    results: pd.DataFrame
    manifest: dict
    device: str = "cpu"
    cache: str | None = None
    data_dir: str | None = None
    _models: Any = field(default=None, repr=False)  # a distortion.ModelCache, made on first use

    @property
    def spec(self) -> "RunSpec":
        """What the run used: dataset, split, ``n`` images from ``start``, zoo size, ε (pixel
        space), seeds, ... (:meth:`advtransfer.grid.RunSpec.from_manifest`); its
        :meth:`~advtransfer.grid.RunSpec.eval_images` are the images the run evaluated."""
        from ...grid.runspec import RunSpec

        return RunSpec.from_manifest(self.manifest)

    def cells(self) -> Iterator:
        """One named tuple per cell (its first results row: cell_id, surrogate, attack_label, eps,
        eps_str, targeted, ...), in the results table's order."""
        first = self.results.drop_duplicates("cell_id")
        yield from first.itertuples(index=False)

    def victims(self, cell_id: str) -> list[str]:
        """The victims the run evaluated ``cell_id`` on."""
        return self.results.loc[self.results["cell_id"] == cell_id, "victim"].tolist()

    def samples(self, cell_id: str) -> pd.DataFrame:
        """The cell's per-image table (one row per victim × image; see the results schema)."""
        from ...run.store import RunStore

        return RunStore(self.run_dir).read_samples(cell_id, required=True)

    def images(self, cell_id: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x, x_adv, y, index) of a crafted cell: clean and adversarial images, pixels in [0, 1],
        shape (N, C, H, W), the true labels (N,) and the dataset indices (N,), the per-image
        tables' ``index``, in the order of the cell's cached examples."""
        from .distortion import cell_images

        x, x_adv, y, _target, index = cell_images(self.run_dir, cell_id, self.manifest, self.data_dir)
        return x, x_adv, y, index

    def model(self, name: str, size: str | None = None) -> nn.Module:
        """A model of the run (eval mode, on ``device``; takes pixels in [0, 1]), loaded once;
        ``size`` defaults to the zoo size the run evaluated it at."""
        if size is None:
            rows = self.results[self.results["victim"] == name]
            if not len(rows):
                raise UserError(f"model {name!r} is not a victim of this run; pass its zoo size to ctx.model")
            size = str(rows["zoo_size"].iloc[0])
        if self._models is None:
            from .distortion import ModelCache

            self._models = ModelCache(self.cache, self.device)
        return self._models.get(name, size)


def measure_names() -> list[str]:
    return sorted(MEASURES.names())


def run_measure(run_dir: str | Path, name: str, device: str = "cpu", cache: str | None = None,
                data_dir: str | None = None) -> tuple[pd.DataFrame, Path]:
    """Run registered measure ``name`` on a run folder; write ``RUN/measures/<name>.parquet/.csv``
    and its ``.json`` record atomically; return (table, parquet path). UserError for an unknown
    name, a measure that raises, or one that returns no DataFrame (nothing is written then)."""
    from ..runs import run_context

    measure = MEASURES.get(name)
    run_dir = Path(run_dir)
    res, manifest = run_context(run_dir)
    ctx = MeasureContext(run_dir, res, manifest, device, cache, data_dir)
    try:
        table = measure.fn(ctx)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"measure {name!r} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(table, pd.DataFrame):
        raise UserError(f"measure {name!r} returned {type(table).__name__}, not a pandas DataFrame; "
                        "return one table (an empty one when there is nothing to measure)")
    out = run_dir / MEASURES_DIR
    out.mkdir(exist_ok=True)
    path = out / f"{name}.parquet"
    record = {"measure": name, "description": measure.description, "rows": int(len(table)),
              "columns": [str(c) for c in table.columns], "plugin_sha256": MEASURES.code(name)}
    for target, write in ((path, lambda p: table.to_parquet(p, index=False)),
                          (path.with_suffix(".csv"), lambda p: table.to_csv(p, index=False)),
                          (path.with_suffix(".json"), lambda p: Path(p).write_text(json.dumps(record, indent=1) + "\n"))):
        with atomic_path(target) as tmp:
            write(tmp)
    return table, path
