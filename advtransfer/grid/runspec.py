"""What a run used, as its manifest records it: :class:`RunSpec`, the plain values of a grid
(dataset, split, n, start, size, batch size, seeds, norm, ε, ...) after the CLI's flags, and the
one way to get the images a run evaluates (:meth:`RunSpec.eval_images`).

The full :class:`~advtransfer.grid.spec.GridSpec` also holds the attack entries and surrogate rows,
and building or validating it reaches the attack registry, the plugins and the zoo. The analyses
need none of that (a cell's resolved attack and surrogates are in the manifest's ``cells``), and the
report may not reach model code (tests/test_structure.py), so they read this small frozen view,
which imports only core/ and data/. It also holds the defaults of these fields: GridSpec's plain
fields take theirs from here, so the loader, the runner and the analyses share one copy.

A manifest written by a run of this version carries the view under ``spec``
(:meth:`RunSpec.to_dict`); older manifests carry only the raw grid file under ``grid``, which
:meth:`RunSpec.from_manifest` reads with these defaults for the keys the file left out (there the
values are the file's: a CLI override such as ``-n`` was not recorded).
"""
from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from ..core.errors import UserError
from ..core.utils import parse_fraction


@dataclass(frozen=True)
class RunSpec:
    """The plain values of one run's grid. ε in pixel space ([0,1] images; 8/255 ≈ 0.0314); the
    evaluation images are ``n`` images of ``split`` from dataset index ``start``. Sequences are
    tuples (the view is frozen and hashable); :meth:`to_dict` writes them as JSON lists."""

    name: str                          # the run's name (the grid file's ``name``, else its stem)
    size: str                          # zoo size the run used ("" when an old manifest does not say)
    eps: tuple[float, ...]             # radii in pixel space, one cell each
    victims: tuple[str, ...]           # model names every cell is evaluated on
    dataset: str = "cifar10"
    split: str = "test"
    n: int = 1000                      # evaluation images (count)
    start: int = 0                     # first evaluation image's dataset index
    batch_size: int = 250              # crafting batch (images)
    seeds: tuple[int, ...] = (0,)
    norm: str = "linf"
    targeted: bool = False
    budget: str = "steps"
    matched: tuple[str, ...] = ()
    executor: str = "serial"
    workers: int | None = None
    craft_dataset: str = ""
    precision: str = "fp32"
    compile: str = "off"
    reference: str | None = None
    description: str = ""
    plugins: tuple[str, ...] = ()

    # --- fields and defaults ----------------------------------------------------------------
    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The view's fields, in order (each is a :class:`GridSpec` field of the same name)."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def field_default(cls, name: str) -> Any:
        """The default of field ``name``; KeyError for a field without one (name, size, eps, victims)."""
        f = {f.name: f for f in fields(cls)}[name]
        if f.default is MISSING:
            raise KeyError(f"run field {name!r} has no default")
        return f.default

    # --- building ---------------------------------------------------------------------------
    @classmethod
    def from_values(cls, values: dict) -> "RunSpec":
        """The view of a mapping of field values (a GridSpec's, or a manifest's ``spec``): lists
        become tuples, ε strings like ``8/255`` become floats, a scalar where a list belongs
        becomes a one-element tuple and a null an empty one; a missing field takes its default (name and size: "", eps
        and victims: empty); keys that are not fields are ignored."""
        out: dict[str, Any] = {}
        for name in cls.field_names():
            try:
                default = cls.field_default(name)
            except KeyError:
                default = () if name in ("eps", "victims") else ""
            out[name] = values.get(name, default)
        for name in ("eps", "victims", "seeds", "matched", "plugins"):
            v = out[name]
            out[name] = tuple(v) if isinstance(v, (list, tuple)) else () if v is None else (v,)
        out["eps"] = tuple(parse_fraction(e, "eps") for e in out["eps"])
        try:
            for name in ("n", "start", "batch_size"):
                out[name] = int(out[name])
            out["seeds"] = tuple(int(s) for s in out["seeds"])
            out["workers"] = None if out["workers"] is None else int(out["workers"])
        except (TypeError, ValueError) as exc:
            raise UserError(f"a run's recorded grid values are not numbers where they must be ({exc})") from None
        out["victims"] = tuple(str(v) for v in out["victims"])
        for name in ("name", "size", "dataset", "split"):
            out[name] = str(out[name])
        return cls(**out)

    @classmethod
    def from_manifest(cls, manifest: dict) -> "RunSpec":
        """What the run of ``manifest`` (``RUN/manifest.json`` as read by
        :meth:`advtransfer.run.store.RunStore.read_manifest`) used: its ``spec`` where it has one;
        else (a manifest written before the field) its raw grid file ``grid``, each key the file
        left out at its default, the name from ``grid_file`` when the file gave none. An empty
        manifest (no run yet, or a records folder without one) gives the defaults."""
        spec = manifest.get("spec")
        if isinstance(spec, dict):
            return cls.from_values(spec)
        raw = manifest.get("grid")
        raw = dict(raw) if isinstance(raw, dict) else {}
        if not raw.get("name") and manifest.get("grid_file"):
            raw["name"] = Path(str(manifest["grid_file"])).stem
        return cls.from_values(raw)

    def to_dict(self) -> dict[str, Any]:
        """The view as JSON-able values (the manifest's ``spec``); :meth:`from_values` reads it back."""
        return {name: list(v) if isinstance(v, tuple) else v for name, v in
                ((name, getattr(self, name)) for name in self.field_names())}

    # --- images -----------------------------------------------------------------------------
    def load_split(self, data_dir: str | os.PathLike | None = None):
        """The run's evaluation split (:class:`advtransfer.data.Split`: ``split`` of ``dataset``)."""
        from ..data import load_dataset

        return load_dataset(self.dataset, self.split, data_dir)

    def eval_images(self, data_dir: str | os.PathLike | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The images the run evaluates, as the cell runner crafts and evaluates them: ``(x, y,
        index)`` with x float32 N×C×H×W, pixels in [0, 1], y the labels (N,), index the dataset
        indices ``start .. start+n-1`` (N = ``n``). UserError when the split has fewer images."""
        from ..data import eval_subset

        return eval_subset(self.load_split(data_dir), self.n, self.start)

    def held_out_images(self, limit: int, data_dir: str | os.PathLike | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Up to ``limit`` images of the split right after the evaluation images (dataset indices
        from ``start + n``; fewer, possibly none, where the split ends), as :meth:`eval_images`
        gives them: images a selection may look at without seeing the ones it is scored on."""
        from ..data import eval_subset

        ds = self.load_split(data_dir)
        first = self.start + self.n
        count = min(int(limit), len(ds) - first)
        if count <= 0:
            return ds.tensors(slice(first, first))
        return eval_subset(ds, count, first)


__all__ = ["RunSpec"]
