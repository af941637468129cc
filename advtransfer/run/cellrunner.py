"""One grid cell run end to end in whatever process runs it: the models it needs (loaded once
per process), its examples (crafted or loaded from the run's cache), its victims' rows and
per-image table, written as the cell's own files. The serial runner (:mod:`advtransfer.run.runner`)
and every worker of the parallel executors (:mod:`advtransfer.run.executors`) use :class:`CellRunner`."""
from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pandas as pd
import torch
import torch.nn as nn
from tqdm.auto import tqdm

from .. import __version__
from ..core import faults, schema
from ..attacks.base import Attack, CraftContext, Crafted, SurrogateSet
from .cell import evaluate_cell
from .context import RunContext
from ..data import eval_subset, load_dataset
from ..core.errors import UserError
from ..grid import Cell, GridSpec, describe, expand_cells
from ..core.metrics import labels
from ..models import zoo
from .store import RunStore
from ..core.utils import eps_to_str, git_sha



class ModelCache:
    """Loads zoo models once per run; remembers each victim's labels on the clean images."""

    def __init__(self, size: str, ctx: RunContext, compile_mode: str = "off",
                 log: Callable[[str], None] | None = None) -> None:
        # ctx: the run's model cache, data folder (collections and posterior smoothing may read
        # training images) and device
        self.size, self.cache, self.device, self.data_dir = size, ctx.cache, ctx.device, ctx.data_dir
        self.compile_mode, self.log = compile_mode, log
        self._models: dict[str, nn.Module] = {}
        self._compiled: dict[str, tuple[nn.Module, str]] = {}
        self._clean: dict[str, torch.Tensor] = {}
        self._sources: dict[str, zoo.Source] = {}
        # drawn surrogates (collections, posterior smoothing): the parameters each was built with,
        # by surrogate key; the rows' surrogate_params record them
        self.params: dict[str, dict] = {}

    def get(self, name: str) -> nn.Module:
        """One network of ``name`` (a collection's first member), loaded once: victims, clean
        labels, a model an attack uses besides its surrogates."""
        if name not in self._models:
            self._models[name] = zoo.load_model(name, self.size, self.cache, self.device, member=0)
        return self._models[name]

    def source(self, name: str) -> zoo.Source:
        """Where ``name`` comes from at the run's size (resolved once)."""
        if name not in self._sources:
            self._sources[name] = zoo.resolve(name, self.size, self.cache)
        return self._sources[name]

    def surrogate(self, name: str, options: dict | None = None) -> nn.Module:
        """The module attacked for ``name``: the model, or for a multi-sample entry (several
        members, or SWAG) a collection built with the grid's ``options``, or posterior smoothing
        around a single model."""
        options = dict(options or {})
        key = surrogate_key(name, options)
        if key not in self._models:
            self._models[key], params = self.source(name).attacked(options, self.size, self.cache, self.device,
                                                                   self.data_dir, plain=lambda: self.get(name))
            if params:
                self.params[key] = params
        return self._models[key]

    def attacked(self, name: str, options: dict | None, hooks: bool, probe: tuple[torch.Tensor, torch.Tensor]
                 ) -> tuple[nn.Module, str]:
        """(the module an attack crafts on for ``name``, the compile choice for the row). With
        ``compile_mode`` auto, a single model (not a collection, no options) is timed eager
        against compiled on the ``probe`` batch once per run (:func:`advtransfer.core.accel.choose_compiled`);
        attacks that hook into layers (``hooks``) always get the eager model."""
        module = self.surrogate(name, options)
        if self.compile_mode == "off":
            return module, "off"
        if surrogate_key(name, options) in self.params:  # drawn: a collection or posterior smoothing
            return module, "eager (collection)"
        if hooks:
            return module, "eager (hooks)"
        if name not in self._compiled:
            from ..core.accel import choose_compiled

            x, y = probe
            chosen, info = choose_compiled(module, x.to(self.device), y.to(self.device))
            self._compiled[name] = (chosen, info["choice"])
            if self.log is not None:
                self.log(f"compile {name}: {info['choice']} (input-gradient pass on {len(x)} images: eager "
                         f"{info['eager_ms']:.1f} ms, compiled {info['compiled_ms']:.1f} ms; compiling took "
                         f"{info['compile_s']:.0f} s)")
        return self._compiled[name]

    def clean_labels(self, names: list[str], x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each model's labels on the run's clean images ``x`` (computed once per run)."""
        for n in names:
            if n not in self._clean:
                self._clean[n] = labels(self.get(n), x, 500, self.device)
        return {n: self._clean[n] for n in names}


def build_surrogate_set(cell: Cell, models: ModelCache, hooks: bool = False,
                        probe: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[SurrogateSet, str]:
    """(the cell's surrogate set, weights from the grid entry; the compile choice per model,
    joined with +). ``hooks``: the attack hooks into layers (never compiled); ``probe``: the
    images and labels a compile choice is timed on."""
    s = cell.surrogate
    opts = dict(s.options)
    if probe is None:
        return SurrogateSet([models.surrogate(m, opts) for m in s.models], names=list(s.models), weights=s.weights), "off"
    picked = [models.attacked(m, opts, hooks, probe) for m in s.models]
    return (SurrogateSet([p[0] for p in picked], names=list(s.models), weights=s.weights),
            "+".join(p[1] for p in picked))


def surrogate_kind(cell: Cell, cards: dict[str, dict]) -> str:
    if len(cell.surrogate.models) > 1:
        return "ensemble"
    return cards[cell.surrogate.models[0]].get("kind", "single")


def surrogate_key(name: str, options: dict | None) -> str:
    """The key of the module attacked for model ``name`` with surrogate ``options`` (one per run)."""
    return f"{name}|{json.dumps(dict(options or {}), sort_keys=True)}"


def surrogate_params(cell: Cell, cards: dict[str, dict], built: dict[str, dict] | None = None) -> str:
    """JSON of how the surrogate was trained (card ``surrogate_params``: rho, K, epoch, ...) and,
    for a collection or posterior smoothing, how it was drawn: the parameters it was built with
    (``built``, by :func:`surrogate_key`: grid options, K, per_step, seed, fitted scales, ...);
    keyed by model name for a set of several."""
    opts = dict(cell.surrogate.options)

    def one(m: str) -> dict:
        return {**(cards[m].get("surrogate_params") or {}), **(built or {}).get(surrogate_key(m, opts), {})}

    ms = cell.surrogate.models
    return json.dumps(one(ms[0]) if len(ms) == 1 else {m: one(m) for m in ms}, sort_keys=True, default=str)


def _cell_fields(spec: GridSpec, cell: Cell, attack, run_id: str, cards: dict[str, dict], sha: str,
                 built: dict[str, dict] | None = None) -> dict:
    p = cell.config["attack_params"]
    return {
        "run_id": run_id, "cell_id": cell.cell_id, "dataset": spec.dataset, "split": spec.split,
        "n": spec.n, "seed": cell.seed, "attack": cell.attack.attack, "attack_label": cell.attack.label,
        "attack_kind": attack.kind, "attack_version": attack.version,
        "attack_params": json.dumps(p, sort_keys=True), "norm": p["norm"], "eps": cell.eps,
        "eps_str": eps_to_str(cell.eps), "steps": int(p["steps"]), "targeted": bool(p["targeted"]),
        "ensemble": p.get("ensemble", "logit"), "match": cell.attack.match, "baseline_for": cell.attack.baseline_for,
        "surrogate": cell.surrogate.name, "surrogate_base": cell.surrogate.base or cell.surrogate.name,
        "replicate": cell.surrogate.replicate, "surrogate_kind": surrogate_kind(cell, cards),
        "surrogate_params": surrogate_params(cell, cards, built), "n_surrogates": len(cell.surrogate.models),
        "surrogate_sha": "+".join(cards[m]["sha256"] for m in cell.surrogate.models), "zoo_size": spec.size,
        "git_sha": sha, "advtransfer_version": __version__, "torch_version": torch.__version__,
    }


def craft_or_load(cell: Cell, attack: Attack, S: SurrogateSet, ctx: CraftContext, store: RunStore,
                  log: Callable[[str], None], fields: dict | None = None) -> Crafted:
    """The cell's adversarial examples: from the run's cache if present, else crafted through the
    attack's craft protocol (whatever its kind) and cached with its extra tensors and row fields
    (with ``fields``: how they were crafted, e.g. precision and compile choice, kept with them)."""
    cached = store.load_adv(cell.cell_id)
    if cached is not None:
        t, meta = cached
        same = json.dumps(meta.get("cell"), sort_keys=True) == json.dumps(cell.config, sort_keys=True)
        if not same or not torch.equal(t["index"], ctx.index[torch.isin(ctx.index, t["index"])]):
            raise UserError(f"cached examples {store.adv_path(cell.cell_id)} do not belong to this cell; delete the file to re-craft")
        extra = {k: v for k, v in t.items() if k not in ("x_adv", "index", "target")}
        return Crafted(t["x_adv"], t["index"], t.get("target"), int(meta["grad_evals"]), float(meta["craft_s"]),
                       extra, dict(meta.get("fields") or {}))
    log(f"crafting {describe(cell)} on {len(ctx.x)} images ...")
    res = attack.craft(S, ctx)
    res.fields = {**(fields or {}), **res.fields}
    tensors = {"x_adv": res.x_adv, "index": res.index, **res.tensors}
    if res.target is not None:
        tensors["target"] = res.target
    store.save_adv(cell.cell_id, tensors, {"cell": cell.config, "grad_evals": res.grad_evals,
                                           "craft_s": res.craft_s, "device": ctx.device, "fields": res.fields})
    faults.point("adv_saved")
    return res


class RunLog:
    """``log`` that also appends each line, with a UTC timestamp, to ``RUN/run.log``."""

    def __init__(self, run_dir: Path, echo: Callable[[str], None] = print) -> None:
        self.path, self.echo = run_dir / "run.log", echo

    def write(self, msg: str) -> None:
        """Into run.log only."""
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(f"{stamp} {msg}\n")

    def __call__(self, msg: str) -> None:
        self.echo(msg)
        self.write(msg)

    def warn(self, msg: str) -> None:
        """A warning (a corrupt file found and rebuilt): stderr and run.log."""
        print(msg, file=sys.stderr, flush=True)
        self.write(msg)


class CellRunner:
    """Everything a process needs to run cells of a grid whose models are trained: the data, the
    models (loaded on first use), the zoo cards and the run folder. The serial executor uses one
    in the main process; each worker of the parallel executors builds its own
    (:mod:`advtransfer.run.executors`). :meth:`run` runs one cell and writes its files only (examples,
    per-image table, shard), so any number of processes can run different cells of one folder.
    ``ctx``: the run's folder, model cache, data folder, device and progress flag."""

    def __init__(self, spec: GridSpec, ctx: RunContext, log: Callable[[str], None] = print) -> None:
        self.spec, self.ctx, self.log = spec, ctx, log
        self.run_dir, self.device, self.progress, self.data_dir = ctx.run_dir, ctx.device, ctx.progress, ctx.data_dir
        self.store = RunStore(self.run_dir, log.warn if isinstance(log, RunLog) else log)
        self.cards = {m: zoo.read_card(m, spec.size, ctx.cache) for m in spec.model_names()}
        missing = [m for m, c in self.cards.items() if c is None]
        if missing:
            raise UserError(f"models {', '.join(missing)} are not trained at size {spec.size}; "
                            f"run `advtransfer zoo train {' '.join(missing)} --size {spec.size}` first")
        self.shas = {m: c["sha256"] for m, c in self.cards.items()}
        specs = zoo.load_specs()
        self.variants = {m: zoo.get_spec(m, specs).data_variant(spec.size) for m in spec.model_names()}
        self.cells = expand_cells(spec, self.shas)
        self.x, self.y, self.index = spec.run_spec().eval_images(ctx.data_dir)  # the measures reload these
        if str(ctx.device).startswith("cuda"):  # page-locked host copies: faster batch transfers to the GPU
            self.x, self.y = self.x.pin_memory(), self.y.pin_memory()
        self.models = ModelCache(spec.size, ctx, spec.compile, log)
        self.sha = git_sha()
        self.run_id = self.run_dir.name

    def train_data(self, n: int):
        """The first n training images, for kinds that learn on training data: of the grid's
        ``craft_dataset`` where it names one (e.g. the unshifted source domain), else its dataset."""
        return eval_subset(load_dataset(self.spec.craft_dataset or self.spec.dataset, "train", self.data_dir), n)

    def cell(self, cell_id: str) -> Cell:
        for c in self.cells:
            if c.cell_id == cell_id:
                return c
        raise KeyError(f"cell {cell_id} is not a cell of grid {self.spec.name} with the current weights")

    def run(self, cell: Cell) -> int:
        """Craft (or load) the cell's examples, evaluate the victims it still needs and write its
        per-image table and shard. Returns the number of victims evaluated (0: already done)."""
        spec, store, x, y, index = self.spec, self.store, self.x, self.y, self.index
        todo, shard = victims_to_evaluate(store, cell, spec.victims, self.shas)
        if not todo:
            return 0
        attack = cell.fresh_attack()
        # a compile choice is timed only for cells that craft (cached examples keep their own record)
        probe = None if store.adv_intact(cell.cell_id) else (x[:spec.batch_size], y[:spec.batch_size])
        S, compiled = build_surrogate_set(cell, self.models, attack.hooks_model, probe)
        with tqdm(total=len(x), desc="  craft", unit="img", leave=False, disable=not self.progress) as cbar:
            ctx = CraftContext(x, y, index, spec.batch_size, self.device, self.train_data, progress=cbar.update,
                               precision=spec.precision, log=self.log, load_model=self.models.get)
            res = craft_or_load(cell, attack, S, ctx, store, self.log,
                                fields={"compile": compiled})
        fields = {**_cell_fields(spec, cell, attack, self.run_id, self.cards, self.sha, self.models.params), **res.fields,
                  "n": len(res.index)}
        learned = res.fields.get("n_craft")  # kinds that learn on training images spend their passes there
        if "surrogate_passes" not in res.fields:  # an attack may record its exact total
            fields["surrogate_passes"] = float(res.grad_evals) * (float(learned) if learned is not None else len(res.index))
        victims = {v: self.models.get(v) for v in todo}
        with tqdm(total=len(todo), desc="  evaluate", unit="victim", leave=False, disable=not self.progress) as vbar:
            # the surrogate's clean labels come from the eager models: a compiled one would compile
            # again for inference mode
            S_eval = S if compiled in ("off", "") else build_surrogate_set(cell, self.models)[0]
            rows, samples = evaluate_cell(res, S_eval, victims, x, y, index, self.models.clean_labels(todo, x), 500,
                                          self.device, progress=lambda _v: vbar.update(1))
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        rows = [{**fields, **r, "victim_family": self.cards[r["victim"]]["family"],
                 "surrogate_data": "+".join(self.variants[m].describe() for m in cell.surrogate.models),
                 "victim_data": self.variants[r["victim"]].describe(), "victim_labels": self.variants[r["victim"]].labels,
                 "is_whitebox": r["victim"] in cell.surrogate.models, "victim_sha": self.shas[r["victim"]],
                 "device": self.device, "created_at": now} for r in rows]
        new = schema.conform(pd.DataFrame(rows), schema.RESULTS)
        if shard is not None:
            new = pd.concat([shard[~shard["victim"].isin(todo)], new], ignore_index=True)
        store.write_samples(cell.cell_id, schema.conform(samples.assign(cell_id=cell.cell_id), schema.SAMPLES))
        faults.point("samples_written")
        store.write_shard(cell.cell_id, new)
        faults.point("shard_written")
        return len(todo)


def victims_to_evaluate(store: RunStore, cell: Cell, victims: list[str], shas: dict[str, str]
                        ) -> tuple[list[str], pd.DataFrame | None]:
    """(victims to evaluate, the cell's sound shard or None). The victims of ``victims`` the cell still needs: those without a row for the current weights
    (``shas``: model → sha256) in a sound shard, or without per-image rows in a sound samples table;
    all of them when its examples are missing or corrupt (they are re-crafted, and every row is
    re-derived from the new ones). A packed cell (``advtransfer pack`` left its examples behind)
    needs nothing while its rows cover ``victims``, else all of them (re-crafted likewise).
    Corrupt files are reported and deleted on the way."""
    shard = store.read_shard(cell.cell_id)
    if shard is None:
        return list(victims), shard
    packed = False
    if not store.adv_intact(cell.cell_id):
        if not store.is_packed(cell.cell_id):
            return list(victims), shard
        packed = True
    done = {v for v, s in zip(shard["victim"], shard["victim_sha"]) if shas.get(v) == s}
    samples = store.read_samples(cell.cell_id)
    done &= set(samples["victim"]) if samples is not None else set()
    todo = [v for v in victims if v not in done]
    return (list(victims) if packed and todo else todo), shard
