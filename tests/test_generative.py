"""Generative attacks (CDA, BIA, FACL, PDCL, CGNC, Dual-Flow): the ε bound holds by construction,
a generator trained on a ci model fools it on held-out test images far more often than random
noise of the same ε, a conditional generator hits the target it is asked for more often than the
other classes, FACL's and PDCL's modules do what they say, PDCL's CLIP path runs on a tiny open_clip
model at random initialisation (no number is taken from it), and a generative cell goes through the
grid runner: training cost in the row, the generator cached with the examples and reused.

Generators here are narrow (width 8, one residual block) and trained for 80-120 updates on
training images 0..999 (10-30 s each on 2 cores); the bands below were measured on the ci resnet20_a
(clean accuracy ~0.5 on test images 0..199) and leave room for another machine's training run."""
from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from advtransfer.attacks import SurrogateSet, create_attack
from advtransfer.attacks.generators import ConditionalResnetGenerator, ResnetGenerator, bound, project_image
from advtransfer.data import eval_subset, load_cifar10
from advtransfer.core.errors import UserError

#: the bands below were measured with Adam at 1e-3: within 80-120 updates the tiny generators learn
#: faster at this step than at the 2e-4 default (which is sized for 600 updates)
TINY = {"n_craft": 1000, "batch": 32, "width": 8, "blocks": 1, "lr": 1e-3}


@pytest.fixture(scope="module")
def train_images():
    """Training images 0..999: generators learn here, never on the test images they are judged on."""
    return eval_subset(load_cifar10("train"), 1000)


def _rates(model, x, y, x_adv, target=None):
    with torch.no_grad():
        clean, adv = model(x).argmax(1), model(x_adv).argmax(1)
    ok = clean == y
    fooled = float(((adv != y) & ok).sum() / ok.sum())
    if target is None:
        return fooled
    hit = float(((adv == target) & ok).sum() / ok.sum())
    # how often the same adversarial images land on each *other* class (neither label nor target):
    # what a generator that ignored its condition would score for the requested target
    other = [float(((adv == c) & ok & (target != c) & (y != c)).sum() / (ok & (target != c) & (y != c)).sum())
             for c in range(10)]
    return fooled, hit, sum(other) / len(other)


# --- the ε bound ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm,eps", [("linf", 8 / 255), ("l2", 0.5)])
def test_bound_holds_for_any_raw_output(norm, eps):
    """δ = bound(r) is inside the ε-ball whatever r is (huge, tiny, mixed signs), and clipping x + δ
    to [0,1] only shrinks it."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(16, 3, 32, 32, generator=g)
    for scale in (1e-6, 1.0, 1e3, 1e8):
        r = torch.randn(16, 3, 32, 32, generator=g) * scale
        d = bound(r, eps, norm)
        x_adv = (x + d).clamp(0, 1)
        n = (x_adv - x).flatten(1).abs().amax(1) if norm == "linf" else (x_adv - x).flatten(1).norm(dim=1)
        assert float(n.max()) <= eps * (1 + 1e-5) + 1e-7
        assert 0 <= float(x_adv.min()) and float(x_adv.max()) <= 1
    # a large raw map uses the budget (the bound is not a clamp to zero)
    assert float(bound(torch.full((1, 3, 4, 4), 50.0), eps, norm).flatten(1).norm(dim=1 if norm == "l2" else None)
                 .max() if norm == "l2" else bound(torch.full((1, 3, 4, 4), 50.0), eps, norm).max()) == pytest.approx(eps, rel=1e-4)


@pytest.mark.parametrize("name", ["cda", "bia", "facl", "cgnc", "dual_flow"])
@pytest.mark.parametrize("norm,eps", [("linf", 8 / 255), ("l2", 0.5)])
def test_every_generator_stays_in_the_ball_with_wild_weights(name, norm, eps):
    """Untrained generators whose weights are blown up ×100 (outputs far past saturation) still give
    x_adv in the ε-ball and in [0,1]: the bound is the generator's output layer, not a clip applied
    by the caller (CGNC's blur and Dual-Flow's projected flow steps included)."""
    atk = create_attack(name, eps=eps, norm=norm, steps=1, n_craft=8, batch=4, width=4, blocks=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        G = atk.build(10, None)
    with torch.no_grad():
        for p in G.parameters():
            p.mul_(100)
    G.eval()
    x = torch.rand(12, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    t = torch.arange(12) % 10 if atk.targeted else None
    x_adv = atk.apply(G, x, t, 5, "cpu")
    d = (x_adv - x).flatten(1)
    n = d.abs().amax(1) if norm == "linf" else d.norm(dim=1)
    assert float(n.max()) <= eps * (1 + 1e-5) + 1e-7 and float(n.min()) > 0
    assert 0 <= float(x_adv.min()) and float(x_adv.max()) <= 1


def test_image_output_is_cdas_projection():
    """``output: image`` computes CDA's train.py: the image (tanh(r) + 1)/2 clamped to [x − ε, x + ε]
    by torch.min(torch.max(adv, img - eps), img + eps), then to [0,1], for raw maps of any scale; a
    clamped entry passes no gradient to r, an entry inside the ball passes tanh's; in L2 the
    difference is scaled to norm ε where larger."""
    g = torch.Generator().manual_seed(4)
    x = torch.rand(6, 3, 32, 32, generator=g)
    eps = 8 / 255
    for scale in (1e-3, 1.0, 1e4):
        r = (torch.randn(6, 3, 32, 32, generator=g) * scale).requires_grad_(True)
        img = (torch.tanh(r) + 1) / 2
        authors = torch.clamp(torch.min(torch.max(img, x - eps), x + eps), 0.0, 1.0)
        adv = project_image(r, x, eps, "linf")
        assert torch.equal(adv, authors)
        adv.sum().backward()
        inside = ((img - x).abs() < eps) & (img > 0) & (img < 1)
        assert bool((r.grad[~inside] == 0).all())
        assert torch.allclose(r.grad[inside], (1 - torch.tanh(r.detach()[inside]) ** 2) / 2)
    # mostly far from x at initialisation-like outputs (grey 0.5): most entries sit on the bound
    assert float(((project_image(torch.zeros_like(x), x, eps, "linf") - x).abs() >= eps - 1e-6).float().mean()) > 0.8
    d = project_image(torch.randn(6, 3, 32, 32, generator=g) * 5, x, 0.5, "l2") - x
    assert float(d.flatten(1).norm(dim=1).max()) <= 0.5 * (1 + 1e-5)
    with pytest.raises(ValueError):
        project_image(r.detach(), x, eps, "l1")


@pytest.mark.parametrize("name", ["cda", "bia", "facl"])
@pytest.mark.parametrize("norm,eps", [("linf", 8 / 255), ("l2", 0.5)])
def test_image_output_stays_in_the_ball_with_wild_weights(name, norm, eps):
    """The same as above with ``output: image``: the projection, not the caller, keeps x_adv in the
    ball and in [0,1]. Unsaturated, the two forms differ; in L∞ they coincide once tanh saturates
    (the image is 0 or 1 where r is very negative or positive, projected to x ∓ ε: ε·sign(r))."""
    atk = create_attack(name, eps=eps, norm=norm, steps=1, n_craft=8, batch=4, width=4, blocks=1, output="image")
    plain = create_attack(name, eps=eps, norm=norm, steps=1, n_craft=8, batch=4, width=4, blocks=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        G = atk.build(10, None)
    G.eval()
    x = torch.rand(12, 3, 32, 32, generator=torch.Generator().manual_seed(1)) * 0.8 + 0.1
    assert not torch.allclose(atk.apply(G, x, None, 5, "cpu"), plain.apply(G, x, None, 5, "cpu"))
    with torch.no_grad():
        for p in G.parameters():
            p.mul_(100)
    x_adv = atk.apply(G, x, None, 5, "cpu")
    d = (x_adv - x).flatten(1)
    n = d.abs().amax(1) if norm == "linf" else d.norm(dim=1)
    assert float(n.max()) <= eps * (1 + 1e-5) + 1e-7 and float(n.min()) > 0
    assert 0 <= float(x_adv.min()) and float(x_adv.max()) <= 1
    if norm == "linf":
        sat = (atk.apply(G, x, None, 5, "cpu") - x).abs() >= eps - 1e-6
        assert torch.allclose(x_adv[sat], plain.apply(G, x, None, 5, "cpu")[sat], atol=1e-5)


def test_delta_stats_see_a_collapsed_generator():
    """A generator whose output ignores its input (zero weights, a large bias: every image gets
    δ = ε·tanh(bias)) is measured as universal (share 1) and at the bound on every entry; one whose
    saturated output follows the image (r = 100(x − 0.5) on independent random images) is at the
    bound too but not universal (about 1/N of its energy is shared). A small one (r = 0.1(x - 0.5))
    is at the bound nowhere. (An untrained generator is nearly universal already: its head's bias
    dominates its output at initialisation.)"""
    atk = create_attack("cda", eps=8 / 255, steps=1, n_craft=8, batch=4, width=4, blocks=1)
    x = torch.rand(20, 3, 32, 32, generator=torch.Generator().manual_seed(2)) * 0.8 + 0.1  # no clip at 8/255

    class Follows(torch.nn.Module):
        def __init__(self, scale: float) -> None:
            super().__init__()
            self.scale = scale
            self.p = torch.nn.Parameter(torch.zeros(1))  # apply() reads the parameters' dtype

        def forward(self, z):
            return self.scale * (z - 0.5)

    at_bound, universal = atk.delta_stats(Follows(100.0), x, None, 7, "cpu")
    # |δ| ≥ 0.99ε where |tanh(100(x − 0.5))| ≥ 0.99, i.e. |x − 0.5| ≥ atanh(0.99)/100
    expected = float(((x - 0.5).abs() >= math.atanh(0.99) / 100).double().mean())
    assert at_bound == pytest.approx(expected, abs=0.005) and universal < 0.1, (at_bound, expected, universal)
    assert atk.delta_stats(Follows(0.1), x, None, 7, "cpu")[0] == 0.0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        G = atk.build(10, None)
    G.eval()
    conv = G.head[1]
    with torch.no_grad():
        conv.weight.zero_()
        conv.bias.copy_(torch.tensor([8.0, -8.0, 8.0]))
    at_bound, universal = atk.delta_stats(G, x, None, 7, "cpu")
    assert at_bound == 1.0 and universal == pytest.approx(1.0, abs=1e-9)


def test_generator_shapes_and_sizes():
    x = torch.rand(2, 3, 32, 32)
    assert ResnetGenerator(8, 1)(x).shape == x.shape
    c = ConditionalResnetGenerator(64, 8, 1)
    assert c(x, torch.randn(2, 64)).shape == x.shape
    with pytest.raises(ValueError):
        c(x)
    # the default CPU generator (width 16, 2 blocks) has about 0.2 million parameters
    assert 180_000 < sum(p.numel() for p in ResnetGenerator().parameters()) < 220_000


# --- trained generators ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name,steps,kw", [("cda", 100, {}), ("bia", 80, {}), ("cda", 100, {"output": "image"})])
def test_generator_fools_its_surrogate_on_held_out_images(name, steps, kw, trained, train_images, test_data):
    """Trained 80-100 updates on training images, the generator fools the ci resnet20_a on test images
    0..199 (never seen in training) well above random sign noise of the same ε, which fools it on
    none of them (measured: noise 0.00; CDA ~0.2-0.3, BIA ~0.2 at width 8; CDA with the authors'
    projected image output 0.27 where the default form gave 0.32, 2026-12-07)."""
    model = trained("resnet20_a")
    xt, yt, _ = train_images
    x, y, idx = test_data
    eps = 8 / 255
    atk = create_attack(name, eps=eps, steps=steps, **TINY, **kw)
    S = SurrogateSet([model], ["resnet20_a"])
    G, info = atk.train(S, xt, yt)
    # steps × 32 images over 1,000 training images: 3.2 (2.56) -> 4 (3) surrogate passes per training image
    assert info["passes"] == steps * 32 and info["evals_per_image"] == -(-steps * 32 // 1000)
    assert info["params"] == sum(p.numel() for p in G.parameters())
    x_adv = atk.apply(G, x, None, 100, "cpu")
    assert float((x_adv - x).abs().max()) <= eps + 1e-6
    noise = (x + eps * torch.sign(torch.randn(x.shape, generator=torch.Generator().manual_seed(0)))).clamp(0, 1)
    fooled, fooled_noise = _rates(model, x, y, x_adv), _rates(model, x, y, noise)
    assert fooled >= fooled_noise + 0.10 and fooled >= 0.12, (fooled, fooled_noise)
    # batch norm runs on its running statistics at test time: an image's perturbation does not
    # depend on the batch it is in
    one = atk.apply(G, x[:5], None, 1, "cpu")
    assert torch.allclose(one, x_adv[:5], atol=1e-6)


@pytest.mark.parametrize("name,kw", [("cgnc", {"steps": 120, "views": False}),
                                     ("dual_flow", {"steps": 60, "flow_steps": 2})])
def test_conditional_generator_hits_the_requested_target(name, kw, trained, train_images, test_data):
    """One generator for all classes, told the target: on held-out test images its examples land on
    the requested class far more often than on any other class, which is what a generator ignoring
    its condition would score for the target. At 32/255 (at 8/255 a ci model barely moves toward a
    class within so few updates; the test checks the conditioning, not the paper's numbers);
    measured after 150 updates: CGNC hit 0.26, Dual-Flow 0.25, vs ~0.05 for the other classes."""
    model = trained("resnet20_a")
    xt, yt, _ = train_images
    x, y, idx = test_data
    atk = create_attack(name, eps=32 / 255, **{**TINY, **kw})
    assert atk.targeted  # multi-target generators are targeted by construction
    G, info = atk.train(SurrogateSet([model], ["resnet20_a"]), xt, yt)
    assert info["passes"] == 120 * 32  # CGNC: 120 updates of one view; Dual-Flow: 60 batches × 2 flow steps
    target = (y + 1 + torch.arange(len(y)) % 9) % 10
    x_adv = atk.apply(G, x, target, 100, "cpu")
    assert float((x_adv - x).abs().max()) <= 32 / 255 + 1e-6
    _, hit, other = _rates(model, x, y, x_adv, target)
    assert hit >= 0.12 and hit >= 2 * other, (hit, other)


# --- FACL and PDCL modules ----------------------------------------------------------------------------------
def test_facl_band_split_and_domain_randomisation():
    atk = create_attack("facl", eps=8 / 255, steps=2, n_craft=4, batch=2, width=4, blocks=1)
    x = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    mid, rest = atk.split(x)
    assert torch.allclose(mid + rest, x, atol=1e-6)
    from advtransfer.attacks.transforms import dct_2d

    d, m, lh = atk._bands(x)
    assert float((dct_2d(mid, d) * lh).abs().max()) < 1e-5 and float((dct_2d(rest, d) * m).abs().max()) < 1e-5
    from advtransfer.attacks.generative import TrainState

    st = TrainState(None, 10, {}, torch.Generator().manual_seed(1))
    atk.start(st)
    first = atk.train_input(st, x)  # update 0
    st.step = 1
    second = atk.train_input(st, x)  # update 1
    assert torch.equal(first, x)  # FADR on every other update
    assert not torch.allclose(second, x)
    # FADR leaves the mid band alone (wherever no pixel was clipped to [0,1])
    inside = ((second > 0) & (second < 1)).all()
    if inside:
        assert torch.allclose(dct_2d(second, d) * m, dct_2d(x, d) * m, atol=1e-5)
    assert atk.passes_per_update() == 3
    assert create_attack("facl", facl_weight=0, n_craft=4).passes_per_update() == 1


def test_facl_trains_and_counts_its_three_passes(trained, train_images):
    xt, yt, _ = train_images
    atk = create_attack("facl", eps=8 / 255, steps=4, n_craft=64, batch=16, width=4, blocks=1)
    G, info = atk.train(SurrogateSet([trained("resnet20_a")], ["resnet20_a"]), xt[:64], yt[:64])
    assert info["passes"] == 4 * 16 * 3 and torch.isfinite(torch.tensor(info["loss_last"]))


@pytest.fixture
def tiny_clip_zoo(tmp_path, monkeypatch, cache_dir):
    """A zoo entry for a tiny open_clip model at random initialisation (wiring only, no numbers)."""
    import os

    from advtransfer.core.resources import catalogue_dirs

    from test_pretrained import ENTRIES

    d = tmp_path / "zoo"
    d.mkdir()
    (d / "tiny_clip.yaml").write_text(yaml.safe_dump({"models": [ENTRIES[0]]}))
    monkeypatch.setenv("ADVTRANSFER_ZOO", os.pathsep.join(map(str, [*catalogue_dirs(), d])))
    return ENTRIES[0]["name"]


def test_prompt_text_features_match_clip_text_encoder(tiny_clip_zoo):
    """Learned-context prompts go through CLIP's own text tower: with the context set to the token
    embeddings of 'a photo of a', they equal encode_text('a photo of a <class>.')."""
    import torch.nn.functional as F

    from advtransfer.data import CIFAR10_CLASSES
    from advtransfer.models import zoo

    clip = zoo.load_model(tiny_clip_zoo)
    assert clip.has_text and "_text" not in dict(clip.named_modules())
    model, tok, names = clip.__dict__["_text"]
    assert names == list(CIFAR10_CLASSES)
    ctx = clip.context_init(4)  # 'a photo of a' is four tokens: its word embeddings
    with torch.no_grad():
        ours = clip.prompt_text_features(ctx)
        ref = F.normalize(model.encode_text(tok([f"a photo of a {c}." for c in CIFAR10_CLASSES])), dim=-1)
    assert torch.allclose(ours, ref, atol=1e-5)
    # differentiable in the context (what prompt learning needs), the tower frozen
    c = ctx.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(clip.prompt_text_features(c)[:, 0].sum(), c)
    assert torch.isfinite(g).all() and float(g.abs().sum()) > 0
    assert not any(p.requires_grad for p in model.parameters())


def test_pdcl_runs_with_a_tiny_clip(tiny_clip_zoo, trained, train_images):
    """PDCL's two phases on a tiny random-init open_clip model: prompt learning lowers its
    cross-entropy on the training images, the guided generator trains, CLIP image passes are counted
    apart from surrogate passes, and x_adv stays in the ball. No attack number is taken from it."""
    from advtransfer.models import zoo

    xt, yt, _ = train_images
    atk = create_attack("pdcl", eps=8 / 255, steps=3, n_craft=48, batch=16, width=4, blocks=1,
                        clip=tiny_clip_zoo, prompt_steps=15, prompt_lr=0.05)
    atk.clip_model = zoo.load_model(tiny_clip_zoo)
    S = SurrogateSet([trained("resnet20_a")], ["resnet20_a"])
    G, info = atk.train(S, xt[:48], yt[:48], aux={"clip": atk.clip_model})
    assert sum(info["prompt_losses"][-3:]) < sum(info["prompt_losses"][:3])
    assert not hasattr(atk, "prompt_losses")  # the run keeps its record, not the attack
    assert info["passes"] == 3 * 16 and info["aux_passes"] == 3 * 16
    x_adv = atk.apply(G, xt[:8], None, 8, "cpu")
    assert float((x_adv - xt[:8]).abs().max()) <= 8 / 255 + 1e-6


# --- the held-out curve and the plateau rule ------------------------------------------------------------
def test_plateau_rule():
    """The rule fires once ``patience`` points in a row stay under the best before them + gain, and
    names that best point (the first on ties); a rise of exactly ``gain`` counts as a gain."""
    from advtransfer.attacks.generative import plateau

    assert plateau([0.1, 0.2], 2, 0.01) is None                  # too few points to know
    assert plateau([0.1, 0.3, 0.305, 0.309], 2, 0.01) == 1       # two points under 0.31 after the best 0.3
    assert plateau([0.1, 0.3, 0.305, 0.31], 2, 0.01) is None     # 0.31 = 0.30 + gain: still rising
    assert plateau([0.1, 0.3, 0.2, 0.3, 0.25], 3, 0.01) == 1     # a tie is no gain: the first best is named
    assert plateau([0.5, 0.4, 0.45], 2, 0.0) == 0                # a falling curve flattened at its start
    assert plateau([0.1, 0.2, 0.3, 0.4], 1, 0.05) is None        # rising by 10 points a step never flattens


def test_curve_leaves_training_alone_and_plateau_stops_early(trained, train_images):
    """Measuring the held-out curve does not change what trains (the same weights bit for bit as
    without a curve); the curve has a point before the first update and every curve_every updates,
    with the surrogate passes spent so far; a plateau stop with an unreachable gain stops after
    ``patience`` points past the first and leaves exactly the generator of that shorter budget."""
    model = trained("resnet20_a")
    xt, yt, _ = train_images
    S = SurrogateSet([model], ["resnet20_a"])
    tiny = {**TINY, "n_craft": 800}
    held = (xt[800:], yt[800:])
    plain, info0 = create_attack("cda", steps=30, **tiny).train(S, xt[:800], yt[:800])
    atk = create_attack("cda", steps=30, curve_every=10, curve_n=200, **tiny)
    G, info = atk.train(S, xt[:800], yt[:800], held=held)
    for a, b in zip(plain.state_dict().values(), G.state_dict().values()):
        assert torch.equal(a, b)
    assert info0["curve"] == [] and info0["updates"] == 30
    assert [c[0] for c in info["curve"]] == [0, 10, 20, 30] and [c[1] for c in info["curve"]] == [0, 320, 640, 960]
    assert all(0.0 <= c[2] <= 1.0 for c in info["curve"]) and info["updates"] == 30
    # the first point is the untrained generator's rate, the one fit_rate gives for it
    fresh = create_attack("cda", steps=30, **tiny)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(fresh.seed)
        G0 = fresh.build(10, None)
    G0.eval()
    assert info["curve"][0][2] == pytest.approx(fresh.fit_rate(G0, S, *held, "cpu", 250, 10))
    # gain 1.0 (a hundred points) can never be met: two points past the first, training stops
    stop = create_attack("cda", steps=30, curve_every=10, curve_n=200, stop="plateau", patience=2,
                         plateau_gain=1.0, **tiny)
    Gs, infos = stop.train(S, xt[:800], yt[:800], held=held)
    assert infos["updates"] == 20 and infos["plateau_at"] == 0 and len(infos["curve"]) == 3
    assert infos["passes"] == 20 * 32
    short, _ = create_attack("cda", steps=20, **tiny).train(S, xt[:800], yt[:800])
    for a, b in zip(short.state_dict().values(), Gs.state_dict().values()):
        assert torch.equal(a, b)


def test_curve_parameters_only_in_a_curved_cell_id():
    """Without a curve the curve's parameters are not recorded, so cells made before they existed
    keep their ids; with one, all five are."""
    keys = {"curve_every", "curve_n", "stop", "patience", "plateau_gain"}
    assert not keys & set(create_attack("cda").params())
    assert keys <= set(create_attack("cda", curve_every=100).params())
    # the output form likewise: recorded (and in the cell id) only when it is the authors' image form
    assert "output" not in create_attack("cda").params()
    assert create_attack("cda", output="image").params()["output"] == "image"


# --- parameters ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,kw,match", [
    ("cgnc", {"targeted": False}, "needs targeted: true"),
    ("bia", {"targeted": True}, "untargeted"),
    ("facl", {"objective": "rce"}, "objective must be feature"),
    ("pdcl", {}, "needs clip"),
    ("cgnc", {"cond": "clip"}, "cond clip needs clip"),
    ("cgnc", {"cond": "text"}, "cond must be one of"),
    ("cda", {"objective": "l2"}, "objective must be one of"),
    ("cda", {"width": 0}, "width must be an integer >= 1, got 0"),
    ("cda", {"targeted": True, "objective": "rce"}, "untargeted"),
    ("cda", {"targeted": True}, "aims at one class"),  # an unconditional generator cannot take per-image targets
    ("cgnc", {"target": "least_likely"}, "random or one class"),
    ("dual_flow", {"flow_steps": 0}, "flow_steps"),
    ("facl", {"band_low": 0.6, "band_high": 0.5}, "band_low must lie below band_high"),
    ("cda", {"stop": "plateau"}, "stop plateau reads the held-out curve"),
    ("cda", {"stop": "early"}, "stop must be one of"),
    ("cda", {"curve_every": -1}, "curve_every must be an integer >= 0"),
    ("cda", {"output": "residual"}, "output must be one of"),
    ("cgnc", {"output": "image"}, "builds its perturbation its own way"),
    ("dual_flow", {"output": "image"}, "builds its perturbation its own way"),
])
def test_bad_generator_parameters(name, kw, match):
    with pytest.raises(UserError, match=match):
        create_attack(name, **kw)


# --- through the grid runner ---------------------------------------------------------------------------------
def test_generative_cells_through_the_grid(tmp_path, trained):
    """CDA and CGNC beside MI-FGSM in one grid: the rows record the generator's training (surrogate
    passes, n_craft, parameters, seconds), targeted rows their per-target counts; the generator's
    weights are cached with the examples, rebuild them, and a rerun reuses them without training."""
    from advtransfer.attacks.base import make_targets
    from advtransfer.cli import main
    from advtransfer.run.store import RunStore

    trained("resnet20_a"), trained("resnet20_b"), trained("vgg_a")
    gen = {"n_craft": 96, "batch": 32, "width": 4, "blocks": 1, "steps": 3}
    grid = {"name": "gen_test", "dataset": "cifar10", "n": 60, "size": "ci", "batch_size": 30, "eps": ["8/255"],
            "defaults": {"steps": 2},
            "attacks": {"mifgsm": {}, "mifgsm_t": {"attack": "mifgsm", "targeted": True},
                        "cda": dict(gen), "cgnc": {**gen, "views": False}},
            "surrogates": ["resnet20_a"], "victims": ["resnet20_a", "resnet20_b", "vgg_a"]}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    out = tmp_path / "run"
    args = ["grid", str(path), "--out", str(out), "--no-progress", "--no-plot"]
    assert main(args) == 0
    df = RunStore(out).read_results()
    g = df[df["attack_kind"] == "generative"]
    assert set(g["attack_label"]) == {"cda", "cgnc"} and len(g) == 6
    assert (g["n_craft"] == 96).all() and (g["gen_params"] > 0).all() and (g["gen_train_s"] > 0).all()
    # 3 updates of 32 images on one model: 96 surrogate passes, one per training image
    assert (g["surrogate_passes"] == 96).all() and (g["grad_evals"] == 1).all()
    m = df[df["attack_label"] == "mifgsm"]
    assert (m["surrogate_passes"] == 2 * 60).all()  # 2 steps on each of the 60 test images
    # held-out transfer pooled over the victims that are not the surrogate, beside MI-FGSM of the same
    # targeted flag: the pooled rate is the rows' summed counts, the difference the paired one
    from advtransfer.analysis.report.generative import held_out_transfer

    ho = held_out_transfer(out, df).set_index("attack_label")
    assert set(ho.index) == {"mifgsm", "mifgsm_t", "cda", "cgnc"} and (ho["held_out"] == "resnet20_b+vgg_a").all()
    for label, r in ho.iterrows():
        rows = df[(df["attack_label"] == label) & ~df["is_whitebox"]]
        wb = df[(df["attack_label"] == label) & df["is_whitebox"]]
        assert r["asr"] == pytest.approx(rows["n_success"].sum() / rows["n_clean_correct"].sum())
        assert r["whitebox_asr"] == pytest.approx(float(wb["asr"].iloc[0]))
        assert r["asr_ci_low"] <= r["asr"] <= r["asr_ci_high"]
    assert ho.loc["cda", "baseline"] == "mifgsm" and ho.loc["cgnc", "baseline"] == "mifgsm_t"
    assert ho.loc["mifgsm", "baseline"] == "" and ho.loc["mifgsm_t", "baseline"] == ""
    for a, b in (("cda", "mifgsm"), ("cgnc", "mifgsm_t")):
        assert ho.loc[a, "diff"] == pytest.approx(ho.loc[a, "asr"] - ho.loc[b, "asr"])
        assert ho.loc[a, "diff_ci_low"] <= ho.loc[a, "diff"] <= ho.loc[a, "diff_ci_high"]
    assert ho.loc["cgnc", "surrogate_passes"] == 96 and ho.loc["mifgsm", "surrogate_passes"] == 120
    # the chance level of a targeted row: the same held-out examples landing on a class that is
    # neither the label nor the target, averaged over those 8 classes (counted here from the
    # per-image tables), and the target rate's margin over it
    store, labels = RunStore(out), load_cifar10("test").y
    for label in ("mifgsm_t", "cgnc"):
        cid = df[df["attack_label"] == label]["cell_id"].iloc[0]
        tgt = dict(zip(*(store.load_adv(cid)[0][k].tolist() for k in ("index", "target"))))
        smp = store.read_samples(cid)
        smp = smp[smp["victim"].isin(["resnet20_b", "vgg_a"])]
        y, t = labels[smp["index"].to_numpy()], smp["index"].map(tgt).to_numpy()
        other = ((smp["clean_correct"] & (smp["adv_pred"] != y) & (smp["adv_pred"] != t)).sum() / 8
                 / smp["clean_correct"].sum())
        assert ho.loc[label, "other_target"] == pytest.approx(other)
        assert ho.loc[label, "over_other"] == pytest.approx(ho.loc[label, "asr"] - other)
        assert ho.loc[label, "over_other_ci_low"] <= ho.loc[label, "over_other"] <= ho.loc[label, "over_other_ci_high"]
    assert ho.loc[["mifgsm", "cda"], "other_target"].isna().all()  # untargeted rows have no chance level
    assert (df["linf_max"] <= 8 / 255 + 1e-6).all()
    # targeted (conditional) rows: random targets per image; the per-target counts add up to the row's
    t = g[g["attack_label"] == "cgnc"]
    assert t["targeted"].all() and (g[g["attack_label"] == "cda"]["asr_by_target"] == "").all()
    for _, r in t.iterrows():
        per = json.loads(r["asr_by_target"])
        assert sum(v[0] for v in per.values()) == r["n_success"]
        assert sum(v[1] for v in per.values()) == r["n_clean_correct"]
    store = RunStore(out)
    cid = t["cell_id"].iloc[0]
    tensors, meta = store.load_adv(cid)
    y = load_cifar10("test").y[:60]
    assert torch.equal(tensors["target"], make_targets(torch.as_tensor(y), torch.arange(60), 0))
    # the cached generator reproduces the cached examples
    atk = create_attack("cgnc", eps=8 / 255, targeted=True, **{**gen, "views": False})
    G = atk.build(10, None)
    G.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("gen.")})
    G.eval()
    x = eval_subset(load_cifar10("test"), 60)[0]
    assert torch.allclose(atk.apply(G, x, tensors["target"], 60, "cpu"), tensors["x_adv"], atol=1e-6)
    # a rerun after losing the table trains nothing: the examples come from the cache
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "adv").glob("*.safetensors")}
    for p in (out / "shards").glob("*.parquet"):
        p.unlink()
    assert main(args) == 0
    df2 = RunStore(out).read_results()
    assert {p.name: p.stat().st_mtime_ns for p in (out / "adv").glob("*.safetensors")} == mtimes
    key = ["cell_id", "victim"]
    a, b = df.sort_values(key).reset_index(drop=True), df2.sort_values(key).reset_index(drop=True)
    assert list(a["n_success"]) == list(b["n_success"]) and list(a["surrogate_passes"]) == list(b["surrogate_passes"])
    # the report states each cell's surrogate compute and the per-target success
    html = (out / "report" / "report.html").read_text()
    assert "Generative attacks: compute" in html and "Targeted attacks per target class" in html
    assert "Generative attacks: held-out transfer" in html and "held out, pooled" in html


def test_generator_curve_through_the_grid(tmp_path, trained, capsys):
    """A generative cell with a held-out curve: its row carries the curve (points every curve_every
    updates with the passes spent), the updates made and where it flattened; the report tabulates
    it and shows the curve's figure. A curve that needs more held-out images than the training
    split has stops the grid with one line and exit 2 before anything is crafted."""
    from advtransfer.cli import main
    from advtransfer.run.store import RunStore

    trained("resnet20_a"), trained("resnet20_b")
    gen = {"n_craft": 64, "batch": 16, "width": 4, "blocks": 1, "steps": 6, "curve_every": 2, "curve_n": 40,
           "stop": "plateau", "patience": 2, "plateau_gain": 1.0}
    grid = {"name": "gen_curve_test", "dataset": "cifar10", "n": 30, "size": "ci", "batch_size": 30,
            "eps": ["8/255"], "attacks": {"cda_curve": {"attack": "cda", **gen}},
            "surrogates": ["resnet20_a"], "victims": ["resnet20_a", "resnet20_b"]}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    out = tmp_path / "run"
    assert main(["grid", str(path), "--out", str(out), "--no-progress"]) == 0
    df = RunStore(out).read_results()
    assert len(df) == 2
    r = df.iloc[0]
    curve = json.loads(r["gen_curve"])
    # gain 1.0 is never met: points at 0, 2, 4 updates, then the rule stops it (6 would be the budget)
    assert [c[0] for c in curve] == [0, 2, 4] and [c[1] for c in curve] == [0, 32, 64]
    assert r["gen_updates"] == 4 and r["gen_plateau_at"] == 0 and r["surrogate_passes"] == 64
    assert 0 <= r["gen_at_bound"] <= 1 and 0 <= r["gen_universal"] <= 1
    assert json.loads(r["attack_params"])["curve_n"] == 40
    assert (out / "figures" / "gen_curve_cda_curve_eps8-255.png").exists()
    html = (out / "report" / "report.html").read_text()
    assert "where the held-out curve flattened" in html and "gen_curve_cda_curve_eps8-255.png" in html
    # 49,990 crafting + 40 held-out images need more than the 50,000 training images
    bad = {**grid, "attacks": {"cda_curve": {"attack": "cda", **gen, "n_craft": 49990}}}
    path.write_text(yaml.safe_dump(bad))
    out2 = tmp_path / "run2"
    capsys.readouterr()
    assert main(["grid", str(path), "--out", str(out2), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "curve_n 40 held-out images = 50030 exceed the 50000 training images" in err[0], err
    assert not (out2 / "adv").exists() or not any((out2 / "adv").iterdir())
