"""Every gradient attack keeps its tensors on the input's device. Run on PyTorch's ``meta``
device (shapes only, no data): any tensor an attack creates on the CPU and mixes with x fails
there exactly as it would on a GPU, so the check runs on machines without one."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from advtransfer.attacks import ATTACKS, SurrogateSet, create_attack
from advtransfer.attacks.base import PER_IMAGE_KINDS
from advtransfer.models.archs import _BasicBlock

GRADIENT_ATTACKS = [n for k in PER_IMAGE_KINDS for n in ATTACKS.names(kind=k)]


def _net() -> nn.Module:
    # a ReLU and two residual blocks, so that the backward-path attacks find their sites (sgm, as
    # its authors' code, leaves the first block of a stage undecayed; linbp needs ReLUs)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), _BasicBlock(4, 4, 1), _BasicBlock(4, 4, 1), nn.Flatten(),
                         nn.Linear(4 * 8 * 8, 10)).eval().to("meta")


@pytest.mark.parametrize("n_models", [1, 3])
@pytest.mark.parametrize("name", GRADIENT_ATTACKS)
def test_attack_stays_on_the_input_device(name, n_models):
    assert "adaea" in GRADIENT_ATTACKS  # its per-image weights were once built on the CPU
    x = torch.empty(6, 3, 8, 8, device="meta")
    y = torch.zeros(6, dtype=torch.long, device="meta")
    S = SurrogateSet([_net() for _ in range(n_models)])
    # two copies exercise a copy-averaging attack's device handling as well as its default 20 do
    # (bsr took 27 s of the suite on the meta device with 20)
    few = {"n_copies": 2} if "n_copies" in getattr(ATTACKS.get(name), "extra_defaults", {}) else {}
    atk = create_attack(name, eps=8 / 255, steps=2, **few)
    if name == "admix":  # the images it mixes in live where the attacked ones do
        atk.set_pool(torch.empty(4, 3, 8, 8, device="meta"))
    x_adv = atk(S, x, y)
    assert x_adv.device.type == "meta" and x_adv.shape == x.shape
