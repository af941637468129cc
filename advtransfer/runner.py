"""Runs a grid: trains missing zoo models, crafts each cell once (cached), evaluates victims,
writes shards and the merged table. Rerunning skips finished cells; a victim added to the grid
is evaluated on the cached examples without re-crafting."""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pandas as pd
import torch
import torch.nn as nn
from tqdm.auto import tqdm

from . import __version__
from .attacks.base import SurrogateSet
from .cell import CraftResult, craft, evaluate, predict
from .data import eval_subset, load_dataset
from .errors import UserError
from .grid import Cell, GridSpec, describe, expand_cells
from .metrics import distortion, per_sample_l2
from .models import zoo
from .resources import results_dir
from .store import RunStore
from .utils import eps_to_str, git_sha, versions


def default_run_dir(spec: GridSpec) -> Path:
    return results_dir() / spec.name


class ModelCache:
    """Loads zoo models once per run; remembers clean predictions per victim."""

    def __init__(self, size: str, cache, device: str, data_dir=None) -> None:
        self.size, self.cache, self.device, self.data_dir = size, cache, device, data_dir
        self._models: dict[str, nn.Module] = {}
        self._members: dict[str, list[nn.Module]] = {}
        self.clean_pred: dict[str, torch.Tensor] = {}

    def get(self, name: str) -> nn.Module:
        if name not in self._models:
            self._models[name] = zoo.load_model(name, self.size, self.cache, self.device)
        return self._models[name]

    def surrogate(self, name: str, options: dict | None = None) -> nn.Module:
        """The module attacked for ``name``: the model, or for a multi-sample entry (several
        members, or SWAG) a collection built with the grid's ``options``."""
        from .models.collections import build_collection, is_collection

        card = zoo.read_card(name, self.size, self.cache) or {}
        if not is_collection(card):
            if options:
                raise UserError(f"surrogate options {sorted(options)} need a collection; {name!r} is a single model")
            return self.get(name)
        key = f"{name}|{json.dumps(options or {}, sort_keys=True)}"
        if key not in self._models:
            self._models[key], _ = build_collection(name, card, dict(options or {}), self.size, self.cache,
                                                    self.device, self.data_dir)
        return self._models[key]

    def members(self, name: str) -> list[nn.Module]:
        if name not in self._members:
            self._members[name] = zoo.load_members(name, self.size, self.cache, self.device)
        return self._members[name]


def build_surrogate_set(cell: Cell, models: ModelCache) -> SurrogateSet:
    """The cell's surrogate set (weights from the grid entry)."""
    s = cell.surrogate
    opts = dict(s.options)
    return SurrogateSet([models.surrogate(m, opts) for m in s.models], names=list(s.models), weights=s.weights)


def surrogate_kind(cell: Cell, cards: dict[str, dict]) -> str:
    if len(cell.surrogate.models) > 1:
        return "ensemble"
    return cards[cell.surrogate.models[0]].get("kind", "single")


def surrogate_params(cell: Cell, cards: dict[str, dict]) -> str:
    """JSON of how the surrogate was trained (card ``surrogate_params``: rho, K, epoch, ...) and
    how a collection is drawn (grid options); keyed by model name for a set of several."""
    from .models.collections import is_collection

    def one(m: str) -> dict:
        card = cards[m]
        p = dict(card.get("surrogate_params") or {})
        if is_collection(card):
            p.setdefault("per_step", 1)
            if card.get("kind") != "swag":
                p.setdefault("K", len(card.get("members", [])))
            p.update(dict(cell.surrogate.options))
        return p

    ms = cell.surrogate.models
    return json.dumps(one(ms[0]) if len(ms) == 1 else {m: one(m) for m in ms}, sort_keys=True, default=str)


def _cell_fields(spec: GridSpec, cell: Cell, run_id: str, cards: dict[str, dict], sha: str) -> dict:
    p = cell.config["attack_params"]
    return {
        "run_id": run_id, "cell_id": cell.cell_id, "dataset": spec.dataset, "split": spec.split,
        "n": spec.n, "seed": cell.seed, "attack": cell.attack.attack, "attack_label": cell.attack.label,
        "attack_params": json.dumps(p, sort_keys=True), "norm": p["norm"], "eps": cell.eps,
        "eps_str": eps_to_str(cell.eps), "steps": int(p["steps"]), "targeted": bool(p["targeted"]),
        "ensemble": p.get("ensemble", "logit"), "universal": False, "n_craft": spec.n,
        "surrogate": cell.surrogate.name, "surrogate_kind": surrogate_kind(cell, cards),
        "surrogate_params": surrogate_params(cell, cards),
        "n_surrogates": len(cell.surrogate.models), "zoo_size": spec.size,
        "git_sha": sha, "advtransfer_version": __version__, "torch_version": torch.__version__,
    }


def craft_or_load(cell: Cell, spec: GridSpec, store: RunStore, models: ModelCache, x, y, index,
                  device: str, log: Callable[[str], None], data_dir=None) -> CraftResult:
    """The cell's adversarial examples: from the cache if present, else crafted and cached."""
    from .attacks import ATTACKS
    from .grid import resolve_attack

    if ATTACKS.get(cell.attack.attack).universal:
        return craft_or_load_universal(cell, spec, store, models, x, y, index, device, log, data_dir)
    cached = store.load_adv(cell.cell_id)
    S = build_surrogate_set(cell, models)
    if cached is not None:
        t, meta = cached
        if not torch.equal(t["index"], index):
            raise RuntimeError(f"cached examples of cell {cell.cell_id} hold other images; delete {store.adv_path(cell.cell_id)}")
        with torch.no_grad():
            sur_ok = torch.cat([S.predict(x[i:i + 500].to(device)).cpu() for i in range(0, len(x), 500)]) == y
        return CraftResult(t["x_adv"], t["index"], t.get("target"), int(meta["grad_evals"]),
                           float(meta["craft_s"]), sur_ok)
    attack = resolve_attack(cell.attack, spec, cell.eps, cell.seed, len(cell.surrogate.models))
    log(f"crafting {describe(cell)} on {len(x)} images ...")
    res = craft(attack, S, x, y, index, spec.batch_size, device)
    tensors = {"x_adv": res.x_adv, "index": res.index}
    if res.target is not None:
        tensors["target"] = res.target
    store.save_adv(cell.cell_id, tensors, {"cell": cell.config, "grad_evals": res.grad_evals,
                                           "craft_s": res.craft_s, "device": device})
    return res


def craft_or_load_universal(cell: Cell, spec: GridSpec, store: RunStore, models: ModelCache, x, y, index,
                            device: str, log: Callable[[str], None], data_dir=None) -> CraftResult:
    """A universal cell: δ crafted on training images 0..n_craft-1, applied to the test subset
    (see :mod:`advtransfer.uap`); δ is cached with x_adv. ``res.info`` holds n_craft and the
    attack's records (bandit counts)."""
    from .grid import resolve_attack
    from .uap import craft_universal, universal_eval_subset

    attack = resolve_attack(cell.attack, spec, cell.eps, cell.seed, len(cell.surrogate.models))
    x, y, index = universal_eval_subset(attack, x, y, index)
    S = build_surrogate_set(cell, models)
    cached = store.load_adv(cell.cell_id)
    if cached is not None:
        t, meta = cached
        if not torch.equal(t["index"], index):
            raise RuntimeError(f"cached examples of cell {cell.cell_id} hold other images; delete {store.adv_path(cell.cell_id)}")
        sur_ok = torch.cat([S.predict(x[i:i + 500].to(device)).cpu() for i in range(0, len(x), 500)]) == y
        return CraftResult(t["x_adv"], t["index"], t.get("target"), int(meta["grad_evals"]), float(meta["craft_s"]),
                           sur_ok, meta["info"])
    n_craft = attack.extra["n_craft"]
    x_craft, y_craft, _ = eval_subset(load_dataset(spec.dataset, "train", data_dir), n_craft)
    log(f"crafting universal δ for {describe(cell)} on train images 0..{n_craft - 1} ...")
    res, delta, info = craft_universal(attack, S, x_craft, y_craft, x, y, index, spec.batch_size, device)
    tensors = {"x_adv": res.x_adv, "index": res.index, "delta": delta, "y": y, "x_example": x[:1]}
    if res.target is not None:
        tensors["target"] = res.target
    store.save_adv(cell.cell_id, tensors, {"cell": cell.config, "grad_evals": res.grad_evals,
                                           "craft_s": res.craft_s, "device": device, "info": info})
    return res


def run_grid(spec: GridSpec, out: str | Path | None = None, cache=None, data_dir=None, device: str = "cpu",
             progress: bool = True, log: Callable[[str], None] = print) -> Path:
    """Run every cell of ``spec``; returns the run folder. See the module docstring."""
    run_dir = Path(out) if out else default_run_dir(spec)
    store = RunStore(run_dir)
    zoo.ensure_trained(spec.model_names(), spec.size, cache, data_dir, device, progress, log)
    cards = {m: zoo.read_card(m, spec.size, cache) for m in spec.model_names()}
    shas = {m: c["sha256"] for m, c in cards.items()}
    cells = expand_cells(spec, shas)
    ds = load_dataset(spec.dataset, spec.split, data_dir)
    x, y, index = eval_subset(ds, spec.n, spec.start)
    models = ModelCache(spec.size, cache, device, data_dir)
    for m in spec.model_names():  # verify every checkpoint before anything is written
        models.get(m)
    sha = git_sha()
    run_id = run_dir.name
    manifest = store.read_manifest()
    manifest.update({
        "run_id": run_id, "grid": spec.raw, "grid_file": spec.source, "git_sha": sha, "versions": versions(),
        "device": device, "updated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "zoo": {m: {k: c.get(k) for k in ("arch", "family", "kind", "recipe_hash", "sha256", "clean_acc", "train_s")}
                for m, c in cards.items()},
        "cells": {**manifest.get("cells", {}), **{c.cell_id: c.config for c in cells}},
    })
    manifest.setdefault("created_at", manifest["updated_at"])
    store.write_manifest(manifest)
    bar = tqdm(cells, desc=f"grid {spec.name}", unit="cell", disable=not progress)
    for cell in bar:
        bar.set_postfix_str(describe(cell), refresh=False)
        shard = store.read_shard(cell.cell_id)
        done = set()
        if shard is not None:
            done = {v for v, s in zip(shard["victim"], shard["victim_sha"]) if shas.get(v) == s}
        todo = [v for v in spec.victims if v not in done]
        if not todo:
            continue
        res = craft_or_load(cell, spec, store, models, x, y, index, device, log, data_dir)
        fields = _cell_fields(spec, cell, run_id, cards, sha)
        # a targeted universal cell leaves out the test images of its target class
        keep = torch.isin(index, res.index)
        xc, yc, ic = x[keep], y[keep], index[keep]
        info = res.info
        if info is not None:
            fields.update(universal=True, n=len(ic), n_craft=int(info["n_craft"]),
                          bandit_counts=json.dumps(info["bandit_counts"], sort_keys=True) if "bandit_counts" in info else None)
        dist = distortion(xc, res.x_adv)
        l2 = per_sample_l2(xc, res.x_adv)
        rows, samples = [], []
        for v in todo:
            model = models.get(v)
            if v not in models.clean_pred:
                models.clean_pred[v] = predict(model, x, 500, device)
            row, ps = evaluate(model, xc, yc, res, models.clean_pred[v][keep], 500, device)
            rows.append({**fields, "victim": v, "victim_family": cards[v]["family"],
                         "is_whitebox": v in cell.surrogate.models, "victim_sha": shas[v],
                         **row, **dist, "grad_evals": res.grad_evals, "craft_s": res.craft_s,
                         "device": device, "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
            samples.append(pd.DataFrame({"cell_id": cell.cell_id, "victim": v, "index": ic.numpy(),
                                         "clean_correct": ps["clean_correct"].numpy(),
                                         "success": ps["success"].numpy(), "adv_pred": ps["adv_pred"].numpy(),
                                         "l2": l2.numpy()}))
        new = pd.DataFrame(rows)
        if shard is not None:
            new = pd.concat([shard[~shard["victim"].isin(todo)], new], ignore_index=True)
        store.write_samples(cell.cell_id, pd.concat(samples, ignore_index=True))
        store.write_shard(cell.cell_id, new)
        store.merge()
    bar.close()
    store.merge()
    return run_dir
