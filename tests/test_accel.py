"""Speed options that must change no result beyond rounding: batches halved on out-of-memory,
mixed-precision crafting, the per-model compile choice, vectorised collection members, and
victims evaluated under inference mode."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
import torch.nn as nn

from advtransfer.core.accel import BatchPlan, autocast, check_precision, choose_compiled
from advtransfer.attacks import create_attack
from advtransfer.attacks.base import CraftContext, SurrogateSet
from advtransfer.core.errors import UserError
from advtransfer.core.metrics import labels, predict_batched


class OOMAbove(nn.Module):
    """Wraps a model; raises CUDA's out-of-memory error for batches larger than ``limit``
    (what a GPU does when a batch does not fit), and counts the batch sizes it ran."""

    def __init__(self, model: nn.Module, limit: int) -> None:
        super().__init__()
        self.model, self.limit, self.sizes = model, limit, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(x) > self.limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {len(x)} images")
        self.sizes.append(len(x))
        return self.model(x)


def test_batch_plan_halves_on_oom_and_keeps_the_smaller_size():
    seen, log = [], []

    def fn(s, e):
        if e - s > 3:
            raise torch.OutOfMemoryError("CUDA out of memory")
        seen.append((s, e))
        return list(range(s, e))

    plan = BatchPlan(16, log.append)
    out = [v for chunk in plan.run(fn, 21) for v in chunk]
    assert out == list(range(21))  # every item once, in order, whatever halving happened
    assert plan.size == 2 and plan.halvings == [(16, 8), (8, 4), (4, 2)]
    assert all(e - s <= 2 for s, e in seen)
    assert len(log) == 3 and "out of memory at batch size 16" in log[0]


def test_a_fixed_batch_plan_never_halves():
    """An attack whose examples depend on their batch (randomness drawn per batch) may not be
    recomputed in smaller batches: out of memory is a UserError that says what to do."""
    from advtransfer.core.errors import UserError

    calls = []

    def fn(s, e):
        calls.append((s, e))
        raise torch.OutOfMemoryError("CUDA out of memory")

    plan = BatchPlan(16, fixed="lower the grid's batch_size")
    with pytest.raises(UserError, match="out of memory at batch size 16: lower the grid's batch_size"):
        plan.run(fn, 40)
    assert calls == [(0, 16)] and plan.size == 16 and plan.halvings == []


def test_batch_plan_raises_other_errors_and_oom_at_one():
    with pytest.raises(ValueError):
        BatchPlan(4).run(lambda s, e: (_ for _ in ()).throw(ValueError("not memory")), 8)
    with pytest.raises(torch.OutOfMemoryError):
        BatchPlan(4).run(lambda s, e: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory")), 8)


def test_victim_passes_halve_and_run_under_inference_mode(trained, test_data):
    x, _y, _ = test_data
    model = trained("resnet20_a")
    modes = []
    wrapped = OOMAbove(model, 30)
    orig = wrapped.forward

    def spy(xb):
        modes.append(torch.is_inference_mode_enabled())
        return orig(xb)

    wrapped.forward = spy
    got = predict_batched(wrapped, x[:100], 100)
    ref = predict_batched(model, x[:100], 100)
    assert torch.allclose(got, ref, atol=1e-5)  # same logits whatever the batch
    assert all(modes) and max(wrapped.sizes) <= 30
    assert not got.is_inference()  # an ordinary tensor: callers may modify it in place
    got[0, 0] = 0.0


def test_crafting_halves_the_batch_and_records_it(trained, test_data):
    """The per-image attacks are batch independent (tests/test_attacks.py), so a crafting batch
    halved after an out-of-memory error must give the examples of an uninterrupted run."""
    x, y, index = test_data[0][:48], test_data[1][:48], test_data[2][:48]
    model = trained("resnet20_a")
    atk = create_attack("mifgsm", eps=8 / 255, steps=3)
    ref = atk.craft(SurrogateSet(model), CraftContext(x, y, index, 48))
    log = []
    wrapped = OOMAbove(model, 20)
    got = atk.craft(SurrogateSet(wrapped), CraftContext(x, y, index, 48, log=log.append))
    assert torch.allclose(got.x_adv, ref.x_adv, atol=1e-6)
    assert got.fields["batch_used"] == 12 and ref.fields["batch_used"] == 48
    assert got.grad_evals == ref.grad_evals == 3
    assert any("out of memory" in m for m in log)


def test_bf16_crafting_keeps_white_box_success(trained, test_data):
    """bf16 autocast coarsens the surrogate's logits, but sign steps need only the gradient's
    signs: white-box MI-FGSM (5 steps of ε/5, ε = 8/255: ~94% in fp32 on this model) must stay
    near 1 and within 10 points of fp32 (32 images, ~15 correct: one image is 7 points)."""
    x, y, index = test_data[0][:32], test_data[1][:32], test_data[2][:32]
    model = trained("resnet20_a")
    atk = create_attack("mifgsm", eps=8 / 255, steps=5)
    asr = {}
    for p in ("fp32", "bf16"):
        res = atk.craft(SurrogateSet(model), CraftContext(x, y, index, 32, precision=p))
        assert (res.x_adv - x).abs().amax() <= 8 / 255 + 1e-6  # the ε-ball holds in any precision
        ok = labels(model, x) == y
        asr[p] = float((labels(model, res.x_adv)[ok] != y[ok]).float().mean())
    assert asr["fp32"] >= 0.85 and asr["bf16"] >= 0.85, asr
    assert abs(asr["fp32"] - asr["bf16"]) <= 0.10, asr


def test_precision_checks():
    check_precision("fp32", "cpu")
    check_precision("bf16", "cpu")
    with pytest.raises(UserError, match="fp16 needs a CUDA device"):
        check_precision("fp16", "cpu")
    with autocast("fp32", "cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast("bf16", "cpu"):
        assert torch.is_autocast_enabled("cpu")


def test_compile_choice_follows_the_timing():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    x, y = torch.rand(4, 3, 2, 2), torch.tensor([0, 1, 2, 0])
    twin = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))

    def timer(times):
        return lambda fns, rounds: dict(times)

    chosen, info = choose_compiled(model, x, y, compiler=lambda m: twin, timer=timer({"eager": 1.0, "compiled": 0.5}))
    assert chosen is twin and info["choice"] == "compiled"
    chosen, info = choose_compiled(model, x, y, compiler=lambda m: twin, timer=timer({"eager": 1.0, "compiled": 0.995}))
    assert chosen is model and info["choice"] == "eager"  # under the 2% margin: never risk slower

    def broken(m):
        raise RuntimeError("no C compiler")

    chosen, info = choose_compiled(model, x, y, compiler=broken)
    assert chosen is model and info["choice"].startswith("eager (compile failed")


def test_real_compile_gives_the_eager_gradient():
    """torch.compile on this install (inductor, a C compiler): the compiled input gradient equals
    eager's up to rounding, and a tiny model, which compilation cannot speed up, stays eager."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 10)).eval()
    x, y = torch.rand(16, 3, 32, 32), torch.randint(0, 10, (16,))
    compiled = torch.compile(model)
    grads = []
    for m in (model, compiled):
        xg = x.clone().requires_grad_(True)
        grads.append(torch.autograd.grad(nn.functional.cross_entropy(m(xg), y, reduction="sum"), xg)[0])
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
    chosen, info = choose_compiled(model, x, y, rounds=3, compiler=lambda m: compiled)
    assert info["choice"] in ("compiled", "eager") and info["compiled_ms"] > 0
    assert (chosen is compiled) == (info["eager_ms"] >= 1.02 * info["compiled_ms"])


def test_vectorised_members_equal_sequential(test_data):
    from advtransfer.models.archs import ImageClassifier, build_arch
    from advtransfer.models.collections import MemberCollection

    x, y = test_data[0][:16], test_data[1][:16]
    members = []
    for s in range(3):
        torch.manual_seed(s)
        m = ImageClassifier(build_arch("resnet", 10, depth=8, width=8), channels_last=True).eval()
        for p in m.parameters():
            p.requires_grad_(False)
        members.append(m)
    grads = {}
    for vec in (False, True):
        coll = MemberCollection(members, per_step=3, seed=1, vectorise=vec)
        S = SurrogateSet(coll).bind()
        S.advance()
        outs = coll.step_logits(x)
        assert len(outs) == 3
        grads[vec] = (S.grad(x, y), torch.stack(outs), list(coll.order))
    assert grads[False][2] == grads[True][2]  # the same members drawn
    assert torch.allclose(grads[False][1], grads[True][1], atol=1e-4)
    assert torch.allclose(grads[False][0], grads[True][0], atol=1e-5)


class _Wrapped(nn.Module):
    """Stands in for torch.compile's module in the grid test (compiling a ResNet takes ~25 s on 2
    cores; test_real_compile_gives_the_eager_gradient compiles for real)."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)


def test_grid_records_precision_compile_and_batch(tmp_path, cache_dir, trained, monkeypatch):
    """compile: auto times the surrogate and records its choice (hook-based attacks: eager);
    precision enters the cell id (bf16 examples are not fp32 ones) and the row; compile does not."""
    import yaml

    monkeypatch.setattr(torch, "compile", lambda m: _Wrapped(m))

    from advtransfer.grid import expand_cells, load_grid
    from advtransfer.run.context import RunContext
    from advtransfer.run.runner import run_grid

    trained("resnet20_a"), trained("vgg_a")
    base = {"name": "accel", "dataset": "cifar10", "n": 40, "size": "ci", "batch_size": 40, "eps": ["8/255"],
            "defaults": {"steps": 3}, "attacks": {"mifgsm": {}, "sgm": {}}, "surrogates": ["resnet20_a"],
            "victims": ["resnet20_a", "vgg_a"], "compile": "auto"}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(base))
    spec = load_grid(str(tmp_path / "g.yaml"))
    (tmp_path / "h.yaml").write_text(yaml.safe_dump({**base, "precision": "bf16", "compile": "off"}))
    spec16 = load_grid(str(tmp_path / "h.yaml"))
    shas = {m: "x" for m in spec.model_names()}
    assert {c.cell_id for c in expand_cells(spec, shas)}.isdisjoint({c.cell_id for c in expand_cells(spec16, shas)})
    spec_off = load_grid(str(tmp_path / "g.yaml")).with_overrides(compile="off")
    assert [c.cell_id for c in expand_cells(spec, shas)] == [c.cell_id for c in expand_cells(spec_off, shas)]
    run = run_grid(spec, RunContext(tmp_path / "run", progress=False), log=lambda *_: None)
    df = pd.read_parquet(run / "results.parquet")
    comp = dict(zip(df["attack"], df["compile"]))
    assert comp["mifgsm"] in ("compiled", "eager") and comp["sgm"] == "eager (hooks)"
    assert set(df["precision"]) == {"fp32"} and set(df["batch_used"]) == {40}
    assert "compile resnet20_a:" in (run / "run.log").read_text()
    white = df[(df["attack"] == "mifgsm") & (df["victim"] == "resnet20_a")]["asr"].iloc[0]
    assert white >= 0.8 and not math.isnan(white)  # compiled or not, the attack still works


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 autocast needs a CUDA device")
def test_fp16_crafting_on_a_gpu_keeps_white_box_success(trained, test_data):
    """On a GPU: fp16 autocast leaves white-box MI-FGSM within 10 points of fp32 (as bf16 on the CPU)."""
    x, y, index = test_data[0][:64], test_data[1][:64], test_data[2][:64]
    import copy

    model = copy.deepcopy(trained("resnet20_a")).to("cuda")  # the session's copy stays on the CPU
    atk = create_attack("mifgsm", eps=8 / 255, steps=5)
    asr = {}
    for p in ("fp32", "fp16"):
        res = atk.craft(SurrogateSet(model), CraftContext(x, y, index, 64, device="cuda", precision=p))
        ok = labels(model, x, device="cuda") == y
        asr[p] = float((labels(model, res.x_adv, device="cuda")[ok] != y[ok]).float().mean())
    assert asr["fp32"] >= 0.85 and abs(asr["fp32"] - asr["fp16"]) <= 0.10, asr
