"""Generic attack properties, parametrised over the registry (a new attack is tested without a
new test): ε-ball and range, targeted mode, gradient-evaluation counts, batch independence."""
from __future__ import annotations

import pytest
import torch

from advtransfer.attacks import ATTACKS, Objective, SurrogateSet, create_attack
from advtransfer.attacks.base import PER_IMAGE_KINDS
from advtransfer.attacks.features import FeatureLevelAttack

# per-image kinds: every image gets its own perturbation (universal attacks are tested in test_universal.py)
GRADIENT_ATTACKS = [n for k in PER_IMAGE_KINDS for n in ATTACKS.names(kind=k)]
# attacks defined without a target (a true-class or label-free objective) are untargeted only
TARGETED_ATTACKS = [n for n in GRADIENT_ATTACKS if not issubclass(ATTACKS.get(n), FeatureLevelAttack)]
SMALL = {"vmifgsm": {"n_samples": 3}, "sim": {"n_scales": 3}, "ssa": {"n_copies": 3}, "bsr": {"n_copies": 3},
         "admix": {"n_scales": 2, "n_mix": 2, "n_pool": 100},
         "ila": {"base_steps": 2}, "fia": {"n_ens": 3}, "naa": {"n_ens": 3}}  # keep the suite fast; the formula is checked with these values


def _params(name: str, **kw) -> dict:
    return {"steps": 3, **SMALL.get(name, {}), **kw}


@pytest.fixture(scope="module")
def pair(trained):
    return [trained("resnet20_a"), trained("vgg_a")]


@pytest.fixture(scope="module")
def batch(test_data):
    x, y, idx = test_data
    return x[:24], y[:24], idx[:24]


@pytest.mark.parametrize("norm,eps", [("linf", 8 / 255), ("l2", 0.5)])
@pytest.mark.parametrize("name", GRADIENT_ATTACKS)
def test_eps_ball_range_and_grad_evals(name, norm, eps, pair, batch):
    cls = ATTACKS.get(name)
    if norm not in cls.norms:
        pytest.skip(f"{name} is defined for {cls.norms} only")
    x, y, idx = batch
    atk = create_attack(name, eps=eps, norm=norm, **_params(name))
    S = SurrogateSet(pair, names=["resnet20_a", "vgg_a"])
    res = atk.run(S, x, y, idx)
    x_adv = res.x_adv
    assert x_adv.shape == x.shape and x_adv.dtype == x.dtype
    d = (x_adv - x).flatten(1)
    size = d.abs().amax(1) if norm == "linf" else d.norm(dim=1)
    assert float(size.max()) <= eps + 1e-6, "perturbation leaves the ε-ball"
    assert float(x_adv.min()) >= 0.0 and float(x_adv.max()) <= 1.0, "pixels leave [0,1]"
    assert float(size.mean()) > 0.25 * eps, "the attack barely moved the images"
    # every gradient evaluation is counted, and equals the attack's published formula
    assert res.grad_evals == atk.grad_evals_formula(len(S)) > 0


@pytest.mark.parametrize("name", TARGETED_ATTACKS)
def test_targeted_mode_moves_towards_the_target(name, pair, batch):
    x, y, idx = batch
    S = SurrogateSet(pair)
    target = (y + 1) % 10
    x_adv = create_attack(name, eps=16 / 255, targeted=True, **_params(name, steps=5))(S, x, target, idx)
    # targeted attacks descend the target class's cross-entropy on (almost) every image
    # (the objective is -CE(target); ci-size models are too weak for a reliable hit-rate band)
    call = S.bind(Objective(targeted=True))
    gain = call.loss(x_adv, target) - call.loss(x, target)
    # backward-path attacks ascend a deliberately altered gradient (linearised ReLUs, damped
    # residual branches), not the objective's own: most images, not almost all (a random
    # direction would give about half)
    band = 0.75 if name in ("sgm", "linbp") else 0.9
    assert float((gain > 0).float().mean()) >= band


@pytest.mark.parametrize("name", GRADIENT_ATTACKS)
def test_batch_composition_does_not_change_results(name, pair, batch):
    """Per-sample norms and per-image random draws: a shuffled or differently split batch gives
    the same adversarial examples (up to float rounding)."""
    x, y, idx = batch
    atk = create_attack(name, eps=8 / 255, **_params(name))
    ref = atk(SurrogateSet(pair), x, y, idx)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    shuffled = atk(SurrogateSet(pair), x[perm], y[perm], idx[perm])
    torch.testing.assert_close(shuffled, ref[perm], atol=1e-5, rtol=0)
    parts = [atk(SurrogateSet(pair), x[s], y[s], idx[s]) for s in (slice(0, 7), slice(7, 24))]
    torch.testing.assert_close(torch.cat(parts), ref, atol=1e-5, rtol=0)


def test_unknown_parameter_is_rejected():
    from advtransfer.core.errors import UserError

    with pytest.raises(UserError, match="unknown parameter 'kernel'"):
        create_attack("mifgsm", kernel=3)
    with pytest.raises(UserError, match="odd"):
        create_attack("tifgsm", kernel_size=4)
