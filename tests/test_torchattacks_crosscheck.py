"""Where torchattacks implements the same attack with the same settings, the outputs agree.

torchattacks averages the loss over the batch and normalises MI's gradient by its mean absolute
value; we sum per-sample losses and normalise by the L1 norm. Both are positive per-sample
rescalings, so sign steps agree exactly up to float rounding; we allow a handful of pixels to
differ where a gradient component is within rounding of zero.
"""
from __future__ import annotations

import pytest
import torch

from advtransfer.attacks import SurrogateSet, create_attack

torchattacks = pytest.importorskip("torchattacks", reason="install the torchattacks extra (make install does)")

EPS, ALPHA, STEPS = 8 / 255, 2 / 255, 5

CASES = [
    ("fgsm", {}, lambda m: torchattacks.FGSM(m, eps=EPS)),
    ("ifgsm", {"alpha": ALPHA}, lambda m: torchattacks.BIM(m, eps=EPS, alpha=ALPHA, steps=STEPS)),
    ("ifgsm", {"alpha": ALPHA}, lambda m: torchattacks.PGD(m, eps=EPS, alpha=ALPHA, steps=STEPS, random_start=False)),
    ("mifgsm", {"alpha": ALPHA}, lambda m: torchattacks.MIFGSM(m, eps=EPS, alpha=ALPHA, steps=STEPS, decay=1.0)),
    ("nifgsm", {"alpha": ALPHA}, lambda m: torchattacks.NIFGSM(m, eps=EPS, alpha=ALPHA, steps=STEPS, decay=1.0)),
    ("difgsm", {"alpha": ALPHA, "diversity_prob": 0.0},
     lambda m: torchattacks.DIFGSM(m, eps=EPS, alpha=ALPHA, steps=STEPS, decay=1.0, diversity_prob=0.0)),
    ("tifgsm", {"alpha": ALPHA, "kernel_size": 5, "nsig": 3.0},
     lambda m: torchattacks.TIFGSM(m, eps=EPS, alpha=ALPHA, steps=STEPS, decay=1.0, kernel_name="gaussian",
                                   len_kernel=5, nsig=3, diversity_prob=0.0)),
    ("sim", {"alpha": ALPHA, "nesterov": True, "n_scales": 5},
     lambda m: torchattacks.SINIFGSM(m, eps=EPS, alpha=ALPHA, steps=STEPS, decay=1.0, m=5)),
]


@pytest.mark.parametrize("name,params,make", CASES, ids=[f"{c[0]}-vs-{i}" for i, c in enumerate(CASES)])
def test_matches_torchattacks(name, params, make, trained, test_data):
    model = trained("resnet20_a")
    x, y, idx = test_data
    x, y, idx = x[:32], y[:32], idx[:32]
    ours = create_attack(name, eps=EPS, steps=STEPS if name != "fgsm" else None, **params)(SurrogateSet(model), x, y, idx)
    theirs = make(model)(x, y)
    diff = (ours - theirs).abs()
    assert float(diff.max()) <= EPS * 2 + 1e-6  # both inside the ball
    frac = float((diff > 1e-5).float().mean())
    assert frac <= 1e-3, f"{frac:.2%} of pixels differ from torchattacks"
