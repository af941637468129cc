"""The input transformations of SIM, SSA and BSR against hand-computed cases: the DCT against
scipy's, the spectrum copy and the block shuffle in their identity settings, the SIM gradient
against the mean of the scaled gradients computed by hand. (The registry's generic tests cover
ε-ball, range, targeted mode, gradient counts and batch independence of each attack.)"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.fft
import torch
import torch.nn as nn

from advtransfer.attacks import SurrogateSet, create_attack
from advtransfer.attacks.transforms import (BlockShuffleRotation, SpectrumSimulation, _split_lengths, dct_2d,
                                            dct_matrix, idct_2d)


def _gens(n: int, seed: int = 0) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def test_dct_is_scipys_orthonormal_dct_and_inverts():
    x = torch.rand(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    d = dct_matrix(32)
    torch.testing.assert_close(d @ d.T, torch.eye(32, dtype=torch.float64))
    ref = scipy.fft.dctn(x.numpy(), type=2, norm="ortho", axes=(-2, -1))
    np.testing.assert_allclose(dct_2d(x, d).numpy(), ref, atol=1e-12)
    torch.testing.assert_close(idct_2d(dct_2d(x, d), d), x)


def test_spectrum_copy_identity_settings_and_straight_through_gradient():
    x = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
    d = dct_matrix(32)
    same = SpectrumSimulation(_gens(3), sigma=0.0, rho=0.0, dct=d)(x)
    torch.testing.assert_close(same, x, atol=1e-5, rtol=0)  # no noise, mask 1: the image itself
    y = SpectrumSimulation(_gens(3), sigma=8 / 255, rho=0.5, dct=d)(x)
    assert (y - x).abs().max() > 1e-3  # a real copy
    (g,) = torch.autograd.grad((y * 2).sum(), x)
    torch.testing.assert_close(g, torch.full_like(x, 2.0))  # the gradient at the copy, passed straight through


def test_block_shuffle_permutes_pixels_and_is_identity_with_one_block():
    x = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(BlockShuffleRotation(_gens(4), blocks=1, degrees=0.0)(x), x)
    y = BlockShuffleRotation(_gens(4), blocks=2, degrees=0.0)(x)
    assert y.shape == x.shape
    for i in range(4):  # without rotation only the order of the pixels changes
        torch.testing.assert_close(y[i].flatten().sort().values, x[i].flatten().sort().values)
    assert not torch.equal(y, x)
    r = BlockShuffleRotation(_gens(4), blocks=2, degrees=24.0)(x)
    assert (r == 0).any()  # rotated strips leave zero-filled corners
    for total, parts in ((32, 2), (32, 4), (7, 3), (3, 5)):
        lens = _split_lengths(total, parts, torch.Generator().manual_seed(3))
        assert sum(lens) == total and min(lens) >= 1


def test_sim_gradient_is_the_mean_of_the_scaled_gradients():
    """One SIM step without momentum equals a sign step along (1/m)·Σ_i ∇_x L(x/2^i), computed here
    by hand on a small linear model."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10))
    x = torch.rand(5, 3, 8, 8)
    y = torch.randint(0, 10, (5,))
    eps, m = 4 / 255, 3
    x_adv = create_attack("sim", eps=eps, steps=1, alpha=eps, momentum=0.0, n_scales=m)(SurrogateSet(model), x, y)
    xg = x.clone().requires_grad_(True)
    loss = sum(nn.functional.cross_entropy(model(xg / 2 ** i), y, reduction="sum") for i in range(m)) / m
    (g,) = torch.autograd.grad(loss, xg)
    torch.testing.assert_close(x_adv, (x + eps * g.sign()).clamp(0, 1))


@pytest.mark.parametrize("name,copies", [("sim", "n_scales"), ("ssa", "n_copies"), ("bsr", "n_copies"), ("admix", "n_mix")])
def test_gradient_evaluations_are_steps_times_copies(name, copies):
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10))
    S = SurrogateSet([model, model])
    atk = create_attack(name, eps=4 / 255, steps=2, **{copies: 3})
    if name == "admix":  # 3 mixed-in images x 5 scale copies
        atk.set_pool(torch.rand(4, 3, 8, 8))
    res = atk.run(S, torch.rand(2, 3, 8, 8), torch.tensor([1, 2]))
    assert res.grad_evals == 2 * 3 * (5 if name == "admix" else 1) * 2


def test_admix_gradient_mixes_pool_images_and_scales():
    """With a one-image pool the mixed-in image is known: one Admix step without momentum equals a
    sign step along Σ_i ∇_x L(γ_i·(x + η·p)), computed by hand."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10))
    x, p = torch.rand(4, 3, 8, 8), torch.rand(1, 3, 8, 8)
    y = torch.randint(0, 10, (4,))
    eps, m1, eta = 4 / 255, 3, 0.2
    atk = create_attack("admix", eps=eps, steps=1, alpha=eps, momentum=0.0, n_scales=m1, n_mix=2, portion=eta)
    x_adv = atk.set_pool(p)(SurrogateSet(model), x, y)
    xg = x.clone().requires_grad_(True)
    loss = sum(nn.functional.cross_entropy(model(2.0 ** -i * (xg + eta * p)), y, reduction="sum") for i in range(m1))
    (g,) = torch.autograd.grad(loss, xg)
    torch.testing.assert_close(x_adv, (x + eps * g.sign()).clamp(0, 1))
    with pytest.raises(Exception, match="differ in size"):
        atk.set_pool(torch.rand(2, 3, 16, 16))(SurrogateSet(model), x, y)
