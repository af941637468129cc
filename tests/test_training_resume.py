"""Resumable training (advtransfer.training.resume): a run cut off after an epoch and started
again gives the weights of the uninterrupted run, bit for bit, because every draw after the
resume point (data order, augmentation, Langevin noise) comes from the saved generator states."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import cli, first_train_images


class Cut(Exception):
    """The interruption the test injects at an epoch's start."""


def _train(method: str, recipe: dict, data, cut_at: int | None, monkeypatch, resume=None, build=None,
           sources: dict | None = None):
    """Train a tinycnn (or ``build()``) with ``method``, saving its state to the file ``resume``
    (None: not resumable); with ``cut_at`` the run stops at the start of that epoch (1-based), as a
    kill would, after the previous epochs' resume state was written."""
    from advtransfer.models.archs import ImageClassifier, build_arch
    from advtransfer.core import faults
    from advtransfer.training import TrainingContext
    from advtransfer.training.base import train_from_recipe

    seen = []

    def point(name: str) -> None:
        if name == "epoch_start":
            seen.append(name)
            if cut_at is not None and len(seen) == cut_at:
                raise Cut()

    monkeypatch.setattr(faults, "point", point)  # where both loops' shared ResumableRun announces each epoch
    torch.manual_seed(0)
    net = ImageClassifier(build_arch("tinycnn")) if build is None else build()
    ctx = TrainingContext(name="resume_test", progress=False, resume=resume, sources=sources or {})
    return train_from_recipe(net, {**recipe, "method": method.removesuffix("_sam")}, data, ctx)


@pytest.mark.parametrize("method", ["csgld", "standard", "sam", "pgd_at", "fast", "fast_sam",
                                    "trades", "ensemble_at", "pubdef", "dverge"])
def test_a_run_cut_after_an_epoch_resumes_to_the_uninterrupted_weights(tmp_path, monkeypatch, method):
    """Cut at the start of epoch 3 of 3, then run again: every weight set (cSGLD's four samples,
    two taken before the cut) equals the uninterrupted run's exactly, the learning-rate trace too,
    the card's meta says where it resumed, and the file is gone only when the zoo writes the card
    (here it stays: fit alone never deletes it). The trained defences' own generators (PGD starts,
    the source drawn per image, DVERGE's pairings and the layer drawn per epoch) resume with it,
    and so do their records (PubDef's per-source counts, DVERGE's layers)."""
    from advtransfer.models.archs import ImageClassifier, build_arch

    data = first_train_images(384)
    recipe = {"batch_size": 128, "seed": 5, "weight_decay": 5e-4, "epochs": 3,
              "lr": 0.1, "momentum": 0.9, "schedule": "onecycle", "augment": ["crop", "flip"]}
    if method == "csgld":  # 2 cycles over 3 epochs: samples in epochs 1-2 (before the cut) and 3
        recipe.update(lr=0.5, momentum=0.0, cycles=2, samples_per_cycle=2, noise_fraction=0.5)
    if method == "sam":
        recipe.update(rho=0.05)
    if method == "pgd_at":  # its random starts come from the data generator, restored with it
        recipe.update(at_eps="8/255", at_steps=2)
    if method.startswith("fast"):  # airbench's loop: its lookahead average (taken at step 5, epoch 2) is restored too
        recipe = {"batch_size": 128, "seed": 5, "epochs": 3, "lr": 2.0, "momentum": 0.9,
                  "weight_decay": 0.005, "bias_scaler": 1.0, "label_smoothing": 0.1, "augment": ["flip", "translate"],
                  **({"rho": 0.05} if method == "fast_sam" else {})}
    build, sources = None, None
    if method in ("trades", "pubdef"):
        recipe.update(at_eps="8/255", at_steps=2)
    if method in ("ensemble_at", "pubdef"):  # two frozen sources, so the per-image source draw matters
        torch.manual_seed(1)
        sources = {"s1": ImageClassifier(build_arch("tinycnn")).eval(), "s2": ImageClassifier(build_arch("tinycnn")).eval()}
        recipe.update(sources=["s1", "s2"])
    if method == "dverge":  # a two-member ensemble, the layer drawn anew each epoch
        recipe.update(distill_steps=2)

        def build_ensemble():
            return ImageClassifier(build_arch("ensemble", members=2, member_arch="tinycnn"))
        build = build_ensemble
    whole = _train(method, recipe, data, None, monkeypatch, build=build, sources=sources)
    path = tmp_path / "zoo" / ".resume" / "resume_test.pt"
    with pytest.raises(Cut):
        _train(method, recipe, data, 3, monkeypatch, path, build=build, sources=sources)
    saved = torch.load(path, weights_only=True)
    assert saved["epoch"] == 2 and saved["step"] == 2 * 3  # 384 images at batch 128: 3 steps an epoch
    if method == "csgld":
        assert sorted(saved["extra"]["samples"]) == ["c0s0", "c0s1"]  # the first cycle's, taken before the cut
    again = _train(method, recipe, data, None, monkeypatch, path, build=build, sources=sources)
    assert list(again.states) == list(whole.states)
    for m in whole.states:
        for k, v in whole.states[m].items():
            assert torch.equal(again.states[m][k], v), (m, k)
    assert again.meta["resumed_at_epochs"] == [2] and "resumed_at_epochs" not in whole.meta
    # the first sitting's seconds (its two epochs) are carried over: the card's time counts both sittings
    assert 0 < again.meta["train_s_earlier"] == saved["elapsed"] and "train_s_earlier" not in whole.meta
    assert again.meta["steps"] == whole.meta["steps"] == 9
    assert again.meta["final_train_loss"] == whole.meta["final_train_loss"]
    if method == "csgld":
        assert again.meta["lr_trace"] == whole.meta["lr_trace"]
    if method == "pubdef":
        assert again.meta["source_counts"] == whole.meta["source_counts"] and sum(whole.meta["source_counts"].values()) == 3 * 384
    if method == "dverge":
        assert again.meta["layers_used"] == whole.meta["layers_used"] and len(whole.meta["layers_used"]) == 3
    # without the cut the run writes the state of its last epoch and restarting it trains nothing
    assert torch.load(path, weights_only=True)["epoch"] == 3
    third = _train(method, recipe, data, 1, monkeypatch, path, build=build, sources=sources)  # a cut at epoch 1 would fire if it ran one
    assert all(torch.equal(third.states[m][k], v) for m in whole.states for k, v in whole.states[m].items())


def test_a_resume_state_from_another_recipe_is_set_aside(tmp_path, monkeypatch, capsys):
    """A file written for another recipe (another seed here) is never continued: it is renamed
    .stale with one line on stderr, and the run starts from the beginning (the uninterrupted
    run's weights); an unreadable file likewise."""
    data = first_train_images(256)
    recipe = {"batch_size": 128, "seed": 5, "epochs": 2, "lr": 0.1, "momentum": 0.9}
    path = tmp_path / "r.pt"
    whole = _train("standard", recipe, data, None, monkeypatch)
    with pytest.raises(Cut):
        _train("standard", {**recipe, "seed": 6}, data, 2, monkeypatch, path)
    for damage in (None, b"not a torch file"):
        if damage:
            path.write_bytes(damage)
        capsys.readouterr()
        again = _train("standard", recipe, data, None, monkeypatch, path)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "training from the start" in err[0], err
        assert "resumed_at_epochs" not in again.meta
        assert all(torch.equal(again.states[""][k], v) for k, v in whole.states[""].items())
        assert path.with_suffix(".stale").is_file()


#: the recipes of the two loops for the tests below: 384 images at batch 128, 3 steps an epoch
LOOP_RECIPES = {
    "standard": {"batch_size": 128, "seed": 5, "weight_decay": 5e-4, "epochs": 3, "lr": 0.1, "momentum": 0.9},
    "fast": {"batch_size": 128, "seed": 5, "epochs": 3, "lr": 2.0, "momentum": 0.9, "weight_decay": 0.005,
             "bias_scaler": 1.0, "label_smoothing": 0.1},
}


def _with_dropout():
    """A tinycnn whose logits pass through dropout: its masks come from torch's global generator,
    the one stream neither loop's own generator covers."""
    from advtransfer.models.archs import ImageClassifier, build_arch

    return ImageClassifier(torch.nn.Sequential(build_arch("tinycnn"), torch.nn.Dropout(0.5)))


@pytest.mark.parametrize("method", ["standard", "fast"])
def test_both_loops_resume_torchs_global_random_stream(tmp_path, monkeypatch, method):
    """Both loops share one resume protocol (training/resume.py ResumableRun), which saves and
    restores torch's global generator too: a network drawing from it (dropout) resumes to the
    uninterrupted run's weights in the fast loop as in the standard one (the fast loop's own
    protocol of before restored its data generator only)."""
    data = first_train_images(384)
    recipe = LOOP_RECIPES[method]
    whole = _train(method, recipe, data, None, monkeypatch, build=_with_dropout)
    path = tmp_path / "r.pt"
    with pytest.raises(Cut):
        _train(method, recipe, data, 2, monkeypatch, path, build=_with_dropout)
    assert torch.load(path, weights_only=True)["torch_rng"] is not None
    again = _train(method, recipe, data, None, monkeypatch, path, build=_with_dropout)
    assert again.meta["resumed_at_epochs"] == [1]
    assert all(torch.equal(again.states[""][k], v) for k, v in whole.states[""].items())


def test_a_fast_state_of_the_former_layout_still_resumes(tmp_path, monkeypatch):
    """A state the fast loop saved before the loops shared one protocol (the lookahead average at
    the top level, no ``extra``, no torch generator) is still continued, to the same weights: a
    long run cut off then is not lost."""
    data = first_train_images(384)
    recipe = LOOP_RECIPES["fast"]
    whole = _train("fast", recipe, data, None, monkeypatch)
    path = tmp_path / "r.pt"
    with pytest.raises(Cut):
        _train("fast", recipe, data, 3, monkeypatch, path)
    state = torch.load(path, weights_only=True)
    old = {k: v for k, v in state.items() if k not in ("extra", "torch_rng", "cuda_rng")}
    torch.save({**old, "ahead": state["extra"]["ahead"]}, path)
    again = _train("fast", recipe, data, None, monkeypatch, path)
    assert again.meta["resumed_at_epochs"] == [2]
    assert all(torch.equal(again.states[""][k], v) for k, v in whole.states[""].items())


#: a cSGLD entry of seconds (a tiny CNN on 500 images) for the end-to-end kill test
TINY_CSGLD = """\
models:
  - name: tiny_csgld
    arch: tinycnn
    arch_kwargs: {width: 8}
    family: cnn
    kind: csgld
    recipe: {optimizer: sgd, lr: 0.5, momentum: 0.0, weight_decay: 5.0e-4, batch_size: 100, augment: [crop, flip],
             seed: 3, method: csgld, temperature: 1.0,
             sizes: {ci: {epochs: 2, train_subset: 500, cycles: 2, samples_per_cycle: 2, noise_fraction: 0.5}}}
"""


def test_zoo_train_killed_mid_run_resumes_to_the_same_checksum(tmp_path, monkeypatch, capsys):
    """End to end, as a user meets it: `advtransfer zoo train` killed (SIGKILL, no cleanup) at the
    start of a cSGLD entry's second epoch leaves a resume state and no model; training the entry
    again (in process here, to keep the suite short) says that it resumes, writes the weights an
    uninterrupted run writes (the same sha256 in the card), records where it resumed, and leaves no
    resume state behind."""
    from advtransfer.models.catalogue import get_spec
    from advtransfer.models.sources import train_spec

    (tmp_path / "zoo").mkdir()
    (tmp_path / "zoo" / "tiny.yaml").write_text(TINY_CSGLD)
    monkeypatch.setenv("ADVTRANSFER_ZOO", str(tmp_path / "zoo"))
    cache_a, cache_b = tmp_path / "a", tmp_path / "b"
    killed = cli("zoo", "train", "tiny_csgld", "--size", "ci", "--cache-dir", str(cache_b), "--no-progress",
                 check=False, env_extra={"ADVTRANSFER_KILL_AT": "epoch_start:2"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert list((cache_b / "zoo" / "ci" / ".resume").glob("tiny_csgld-*.pt"))
    assert not (cache_b / "zoo" / "ci" / "tiny_csgld.json").exists()  # a half-trained model is never a model
    from advtransfer.cli import main

    capsys.readouterr()
    assert main(["zoo", "list", "--size", "ci", "--cache-dir", str(cache_b)]) == 0
    listed = next(r for r in capsys.readouterr().out.splitlines() if r.startswith("tiny_csgld"))
    assert "missing (a stopped run resumes after epoch 1 on `zoo train`)" in listed, listed
    spec = get_spec("tiny_csgld")
    a = train_spec(spec, "ci", cache_a, progress=False)
    capsys.readouterr()
    b = train_spec(spec, "ci", cache_b, progress=False)
    assert "tiny_csgld resumes after epoch 1 of 2" in capsys.readouterr().err
    assert len(a["members"]) == 4 and b["sha256"] == a["sha256"] and b["clean_acc_members"] == a["clean_acc_members"]
    assert b["meta"]["resumed_at_epochs"] == [1] and "resumed_at_epochs" not in a["meta"]
    # the card's training time counts the killed sitting's finished epoch too
    assert 0 < b["meta"]["train_s_earlier"] < b["train_s"]
    assert not list((cache_b / "zoo" / "ci" / ".resume").glob("*.pt"))


def test_the_shipped_table_says_what_a_resumed_runs_minutes_cover():
    """A card's time counts every sitting; a state saved before sittings were timed (meta
    train_s_earlier None) cannot, and the table then names the epochs its minutes cover."""
    from advtransfer.models.ship import training_time

    card = {"train_s": 600.0, "recipe": {"epochs": 50}, "meta": {"steps": 10}}
    assert training_time(card) == "10 min"
    card["meta"] = {"resumed_at_epochs": [2, 8], "train_s_earlier": 300.0}
    assert training_time(card) == "10 min over 3 sittings"
    card["meta"] = {"resumed_at_epochs": [8], "train_s_earlier": None}
    assert training_time(card) == "10 min for epochs 9-50 (resumed; earlier sittings not timed)"
