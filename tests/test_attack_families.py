"""Backward-path surgery (SGM, LinBP) and the feature-level attacks (ILA, FIA, NAA, DTA,
representation-space): exact gradient identities on small float64 networks, layer naming, and
the directions each objective must move on a trained ci model."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from advtransfer.attacks import SurrogateSet, create_attack
from advtransfer.attacks.features import FeatureTap, candidate_layers, resolve_layer
from advtransfer.attacks.surgery import LinearBackward, SkipGradient, applied
from advtransfer.core.errors import UserError
from advtransfer.models.archs import _BasicBlock


def _init(net: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    net = net.double()
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.4)
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):  # non-trivial running statistics
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g, dtype=torch.float64) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g, dtype=torch.float64) + 0.5)
    return net.eval()


def _one_block(seed: int = 0) -> nn.Module:
    return _init(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), _BasicBlock(4, 4, 1), nn.Flatten(),
                               nn.Linear(4 * 8 * 8, 10)), seed)


def _input_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    xg = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(F.cross_entropy(model(xg), y, reduction="sum"), xg)
    return g


@pytest.fixture(scope="module")
def small_batch():
    g = torch.Generator().manual_seed(3)
    return torch.rand(5, 3, 8, 8, generator=g, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 4])


def test_sgm_gradient_is_skip_plus_gamma_times_residual(small_batch):
    """One residual block: the input gradient is linear in γ (skip path + γ · residual path), so
    g(γ) = (1 − γ)·g(0) + γ·g(1), where g(1) is the unmodified gradient; the forward values do not move."""
    model, (x, y) = _one_block(), small_batch

    def grad_at(gamma: float) -> torch.Tensor:
        s = SkipGradient(1.0)
        s.gamma = gamma  # γ = 0 (skip path only) is outside the attack's range; the identity needs it
        with applied(s, [model]) as counts:
            assert counts == [1]
            out = model(x)
            g = _input_grad(model, x, y)
        return out, g

    (o1, g1), (o0, g0), (oh, gh) = grad_at(1.0), grad_at(0.0), grad_at(0.3)
    torch.testing.assert_close(g1, _input_grad(model, x, y), rtol=0, atol=0)  # γ = 1 changes nothing
    torch.testing.assert_close(gh, 0.7 * g0 + 0.3 * g1, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(g0, g1)
    torch.testing.assert_close(oh, o1, rtol=0, atol=0)
    torch.testing.assert_close(o0, model(x), rtol=0, atol=0)


def test_surgery_is_removed_afterwards_and_refuses_models_without_sites(small_batch):
    model, (x, y) = _one_block(), small_batch
    before = _input_grad(model, x, y)
    with applied(SkipGradient(0.2), [model]):
        during = _input_grad(model, x, y)
    assert not torch.allclose(during, before)
    torch.testing.assert_close(_input_grad(model, x, y), before, rtol=0, atol=0)
    plain = _init(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(256, 10)), 1)
    with pytest.raises(UserError, match="none of the surrogates"):
        with applied(SkipGradient(0.5), [plain]):
            pass
    with pytest.raises(UserError, match="gamma"):
        create_attack("sgm", gamma=1.5)


def test_linbp_gradient_is_the_linear_networks_backward(small_batch):
    """With every ReLU linearised the input gradient is the ReLU-free network's Jacobian applied to
    the cross-entropy gradient at the *ReLU network's* logits (the forward pass keeps the ReLUs)."""
    x, y = small_batch
    relu_net = _init(nn.Sequential(nn.Conv2d(3, 5, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(5, 4, 3, padding=1),
                                   nn.ReLU(), nn.Flatten(), nn.Linear(256, 10)), 2)
    linear_net = nn.Sequential(relu_net[0], nn.Identity(), relu_net[2], nn.Identity(), relu_net[4], relu_net[5])
    with applied(LinearBackward("0"), [relu_net]) as counts:
        assert counts == [2]
        logits = relu_net(x)
        g = _input_grad(relu_net, x, y)
    torch.testing.assert_close(logits, relu_net(x), rtol=0, atol=0)
    assert relu_net[1].inplace  # restored
    dlogits = torch.softmax(logits, 1) - F.one_hot(y, 10).double()
    xg = x.clone().requires_grad_(True)
    (expect,) = torch.autograd.grad(linear_net(xg), xg, dlogits)
    torch.testing.assert_close(g, expect, rtol=1e-10, atol=1e-12)
    # from the second ReLU on: the first ReLU still gates the gradient
    with applied(LinearBackward("3"), [relu_net]) as counts:
        assert counts == [1]
        assert not torch.allclose(_input_grad(relu_net, x, y), g)


def test_layer_names_and_specs(trained):
    model = trained("resnet20_a")
    assert candidate_layers(model) == [f"net.layers.{k}" for k in range(9)]
    assert resolve_layer(model, "auto") == "net.layers.4"
    assert resolve_layer(model, "penultimate") == "net.fc"
    with pytest.raises(UserError, match="net.layers.4"):
        resolve_layer(model, "net.layers.44", model_name="resnet20_a")
    with FeatureTap(model, "penultimate") as t:
        f, logits = t.features(torch.zeros(2, 3, 32, 32))
    assert f.shape == (2, 64) and logits.shape == (2, 10)


def test_layers_command_lists_the_block_chain(capsys):
    from advtransfer.cli import main

    assert main(["layers", "resnet20_a"]) == 0
    out = capsys.readouterr().out
    assert "net.layers.4" in out and "<- auto" in out.split("net.layers.4")[1].splitlines()[0]
    assert main(["layers", "resnet20_zz"]) == 2


@pytest.mark.parametrize("name", ["ila", "fia", "naa", "dta", "repr_push"])
def test_feature_attacks_refuse_targets_and_collections(name, small_batch):
    with pytest.raises(UserError, match="untargeted only"):
        create_attack(name, targeted=True)

    from advtransfer.attacks import ModelCollection
    from advtransfer.models.collections import MemberCollection

    coll = MemberCollection([_one_block(4), _one_block(4)])  # a two-member LGV-style collection
    assert isinstance(coll, ModelCollection) and not isinstance(_one_block(4), ModelCollection)
    x, y = small_batch
    with pytest.raises(UserError, match="weight collection"):
        create_attack(name, steps=1, **({"base_steps": 1} if name == "ila" else {}))(
            SurrogateSet(coll, names=["lgv"]), x, y)


def test_feature_objectives_move_their_features(trained, test_data):
    """Each attack moves what it optimises, beyond a random perturbation of the same size:
    representation-space: the penultimate features' relative distance from the clean image's;
    ILA: the projection on its guide; FIA/NAA: the weighted features they descend."""
    model = trained("resnet20_a")
    x, y, idx = (t[:24] for t in test_data)
    eps = 8 / 255
    noise = (x + eps * torch.sign(torch.rand(x.shape, generator=torch.Generator().manual_seed(0)) - 0.5)).clamp(0, 1)
    with torch.no_grad(), FeatureTap(model, "penultimate") as t:
        f0 = t.features(x)[0]
        rel = lambda xa: ((t.features(xa)[0] - f0).norm(dim=1) / f0.norm(dim=1))
        push = create_attack("repr_push", eps=eps, steps=5)(SurrogateSet(model), x, y, idx)
        # it ascends exactly this distance: well above a random sign perturbation of the same ε
        assert float(rel(push).median()) > 2 * float(rel(noise).median())
    # ILA's objective rises above the value its own baseline stage reached (it starts from x)
    atk = create_attack("ila", eps=eps, steps=5, base_steps=5)
    res = atk.run(SurrogateSet(model), x, y, idx)
    x_ila = res.x_adv
    assert res.grad_evals == 10
    base = create_attack("mifgsm", eps=eps, steps=5)(SurrogateSet(model), x, y, idx)
    with torch.no_grad(), FeatureTap(model, "auto") as t:
        f0, fb, fi = (t.features(v)[0].flatten(1) for v in (x, base, x_ila))
        guide = (fb - f0) / (fb - f0).norm(dim=1, keepdim=True)
        proj = lambda f: ((f - f0) * guide).sum(1)
        assert float((proj(fi) > proj(fb)).float().mean()) >= 0.8


def test_skipconv_gradient_is_centre_plus_delta_times_the_rest(small_batch):
    """One 3×3 convolution reparameterised as centre tap + rest: the forward value is exactly the
    convolution's, the input gradient is linear in δ (centre path + δ · off-centre path)."""
    from advtransfer.attacks.pas import PathDecay

    x, y = small_batch
    model = _init(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(), nn.Linear(256, 10)), 5)

    def run(delta: float):
        with applied(PathDecay([1.0] * 3, [delta] * 3), [model], require=False) as counts:
            assert counts == ([0] if delta == 1.0 else [1])
            return model(x), _input_grad(model, x, y)

    (o1, g1), (o0, g0), (oh, gh) = run(1.0), run(1e-12), run(0.25)
    torch.testing.assert_close(oh, o1, rtol=0, atol=0)
    torch.testing.assert_close(gh, 0.75 * g0 + 0.25 * g1, rtol=1e-8, atol=1e-10)
    # δ → 0 keeps only the centre tap: the gradient of the 1×1 convolution with the centre weights
    centre = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Flatten(), nn.Linear(256, 10)).double()
    with torch.no_grad():
        centre[0].weight.copy_(model[0].weight[:, :, 1:2, 1:2])
        centre[0].bias.copy_(model[0].bias)
        centre[2].load_state_dict(model[2].state_dict())
    xg = x.clone().requires_grad_(True)
    # the loss's value at the real logits, its gradient through the centre path only
    logits = model(x).detach() + centre(xg) - centre(xg).detach()
    (expect,) = torch.autograd.grad(F.cross_entropy(logits, y, reduction="sum"), xg)
    torch.testing.assert_close(g0, expect, rtol=1e-8, atol=1e-10)


def test_pas_search_command(capsys, trained):
    from advtransfer.cli import main

    trained("resnet20_a"), trained("vgg_a")
    assert main(["pas", "resnet20_a", "--validators", "vgg_a", "--size", "ci", "--n", "48", "--budget", "2",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "references: plain" in out and "pas: {gammas: [" in out
    assert main(["pas", "resnet20_a", "--validators", "resnet20_a", "--size", "ci"]) == 2
    with pytest.raises(UserError, match="gammas must be a list of 3"):
        create_attack("pas", gammas=[0.5, 0.5])


def test_pas_scores_on_images_no_model_trained_on_and_no_grid_evaluates():
    from advtransfer.cli.pas import EVAL_IMAGES, pas_images

    assert pas_images(50_000, 10_000, 500) == ("train", 10_000)  # after the cpu recipe's subset
    assert pas_images(50_000, 49_600, 500) == ("test", EVAL_IMAGES)  # fewer than 500 left: held-out test images
    assert pas_images(50_000, 50_000, 500) == ("test", 1000)  # a converged model used all 50,000


def test_pas_bayesian_search_finds_a_smooth_optimum(monkeypatch):
    """The path score replaced by a known smooth function of (γ, δ) peaking at γ = 0.4, δ = 0.75 in
    every stage: Gaussian-process Bayesian optimisation must reach the top of the 3,375-path space
    with 30 scored paths (10 random + 20 guided; random search's expected best of 30 draws is far
    lower), score each path once and count only distinct ones against the budget."""
    import advtransfer.attacks.pas as pas

    calls = []

    def fake(model, validators, x, y, gm, dl, eps, batch=250):
        calls.append((tuple(gm), tuple(dl)))
        return 1.0 - sum((g - 0.4) ** 2 for g in gm) - sum((d - 0.75) ** 2 for d in dl)

    monkeypatch.setattr(pas, "one_step_score", fake)
    res = pas.search_path(None, [], None, None, budget=30, seed=0, method="bo")
    assert len(calls) == len(set(calls)) == 3 + 30  # 3 references + 30 distinct candidates
    assert res["method"] == "bo" and res["best"]["score"] >= 1.0 - 0.05, res["best"]
    rnd = pas.search_path(None, [], None, None, budget=30, seed=0, method="random")
    assert res["best"]["score"] >= rnd["best"]["score"]
    with pytest.raises(UserError, match="random or bo"):
        pas.search_path(None, [], None, None, method="grid")
