"""Where torchattack (the PyPI package, 1.7.x) implements the same attack with the same settings,
the outputs agree: MI-FGSM, and FIA with its masks switched off (drop rate 0, so both aggregate
the same gradient N times) and its importance taken, as torchattack's port does, from the true
class's softmax probability (``score: prob``; the authors' code and our default use the logit).

Not cross-checked, and why: torchattack's NAA integrates over k/N·x, k = 0..N−1 without noise (the
authors' code and ours: (1 − k/N)·(x + ξ)), its SGM needs torchvision's module names (it is
compared with ours on a torchvision ResNet-18 in tests/test_fidelity.py), and SSA, BSR and Admix
draw their own random copies. torchattack takes the mean loss over the batch and normalises momentum by the mean
absolute gradient; both are positive per-sample rescalings, so sign steps agree up to rounding.
"""
from __future__ import annotations

import pytest
import torch

from advtransfer.attacks import SurrogateSet, create_attack

torchattack = pytest.importorskip("torchattack", reason="install the test extra (make install does)")

EPS, ALPHA, STEPS = 8 / 255, 2 / 255, 5


def _agree(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    diff = (ours - theirs.detach()).abs()
    assert float(diff.max()) <= 2 * EPS + 1e-6  # both inside the ball
    frac = float((diff > 1e-5).float().mean())
    # a handful of pixels may differ where a gradient component is within rounding of zero
    assert frac <= 1e-3, f"{frac:.2%} of pixels differ from torchattack"


@pytest.fixture(scope="module")
def setup(trained, test_data):
    model = trained("resnet20_a")
    x, y, idx = (t[:16] for t in test_data)
    return model, x, y, idx


def test_mifgsm_matches_torchattack(setup):
    model, x, y, idx = setup
    ours = create_attack("mifgsm", eps=EPS, alpha=ALPHA, steps=STEPS)(SurrogateSet(model), x, y, idx)
    theirs = torchattack.MIFGSM(model, device=torch.device("cpu"), eps=EPS, alpha=ALPHA, steps=STEPS, decay=1.0)(x, y)
    _agree(ours, theirs)


def test_fia_matches_torchattack_without_masks(setup):
    model, x, y, idx = setup
    atk = create_attack("fia", eps=EPS, alpha=ALPHA, steps=STEPS, n_ens=4, drop_prob=0.0, score="prob",
                        layer="net.layers.4")
    ours = atk(SurrogateSet(model), x, y, idx)
    theirs = torchattack.FIA(model, device=torch.device("cpu"), eps=EPS, alpha=ALPHA, steps=STEPS, decay=1.0,
                             num_ens=4, drop_rate=0.0, feature_layer_cfg="net.layers.4")(x, y)
    _agree(ours, theirs)
    # and the default logit importance is a different attack (the case tells them apart)
    logit = create_attack("fia", eps=EPS, alpha=ALPHA, steps=STEPS, n_ens=4, drop_prob=0.0,
                          layer="net.layers.4")(SurrogateSet(model), x, y, idx)
    assert float(((logit - theirs).abs() > 1e-5).float().mean()) > 0.01
