"""A new attack kind is one class plus its registry entry: the runner crafts, caches, evaluates
and tabulates it through the one craft protocol without knowing the kind. Shown with a small
generative-style attack defined here (a perturbation network trained on training images)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import yaml

from advtransfer.attacks.base import ATTACKS, Attack, CraftContext, Crafted, SurrogateSet, register_attack


class _Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 3, 3, padding=1))

    def forward(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        return (x + eps * torch.tanh(self.net(x))).clamp(0, 1)   # ‖δ‖∞ ≤ ε by construction


def _register():
    @register_attack("toy_generator", kind="generative", version=1)
    class ToyGenerator(Attack):
        """Trains a tiny conv generator on ``n_train`` training images to raise the surrogate
        set's loss, then perturbs the test images in one forward pass."""

        extra_defaults = {"n_train": 64, "lr": 0.01}

        def craft(self, S: SurrogateSet, ctx: CraftContext) -> Crafted:
            xt, yt, _ = ctx.train_data(self.extra["n_train"])
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                gen = _Generator()
            opt = torch.optim.Adam(gen.parameters(), lr=self.extra["lr"])
            call = S.bind(self.objective())
            evals = 0
            for _ in range(self.steps):
                call.advance()
                loss = -call.loss(gen(xt, self.eps), yt).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                evals += len(S)
            with torch.no_grad():
                x_adv = gen(ctx.x, self.eps)
            return Crafted(x_adv, ctx.index, None, evals, 0.0, fields={"n_craft": len(xt)})

    return ToyGenerator


@pytest.fixture
def toy_kind():
    cls = _register()
    yield cls
    ATTACKS.remove("toy_generator")


def test_new_kind_runs_through_the_unchanged_runner(toy_kind, tmp_path, cache_dir):
    from advtransfer.cli import main
    from advtransfer.run.store import RunStore

    grid = {"name": "kind", "n": 24, "size": "ci", "eps": ["8/255"], "defaults": {"steps": 3},
            "attacks": {"toy_generator": {"n_train": 32}}, "surrogates": ["resnet20_a"],
            "victims": ["resnet20_a", "resnet20_b"]}
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(grid))
    out = tmp_path / "run"
    assert main(["grid", str(path), "--out", str(out), "--no-progress", "--no-plot", "--no-report"]) == 0
    df = RunStore(out).read_results()
    assert len(df) == 2 and set(df["attack_kind"]) == {"generative"} and (df["n_craft"] == 32).all()
    assert (df["linf_max"] <= 8 / 255 + 1e-6).all() and (df["linf_mean"] > 0).all()
    assert not df["universal"].any()  # a kind-specific column of another kind takes its default
    mtime = [p.stat().st_mtime_ns for p in (out / "adv").glob("*.safetensors")]
    assert len(mtime) == 1
    # rerun: the cached examples and the kind's row fields come back from the cache
    (out / "shards").joinpath(f"{df['cell_id'][0]}.parquet").unlink()
    assert main(["grid", str(path), "--out", str(out), "--no-progress", "--no-plot", "--no-report"]) == 0
    df2 = RunStore(out).read_results()
    assert [p.stat().st_mtime_ns for p in (out / "adv").glob("*.safetensors")] == mtime
    assert (df2["n_craft"] == 32).all() and list(df2["n_success"]) == list(df["n_success"])
