"""Ensemble attacks (SVRE, AdaEA, CWA and its ablations) and the ensemble losses of every
gradient attack, on ci-size models trained on real CIFAR-10 (resnet20, vgg, mobilenet)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from advtransfer.attacks import ATTACKS, Objective, SurrogateSet, create_attack
from advtransfer.attacks.adaea import disagreement_mask

ENS = ("resnet20_a", "vgg_a", "mobilenet_a")
ENSEMBLE_ATTACKS = ("svre", "adaea", "cwa", "cwa_sam", "cwa_cse")
EPS = 8 / 255


@pytest.fixture(scope="module")
def members(trained):
    return [trained(m) for m in ENS]


def _surrogates(members, k=None, **kw) -> SurrogateSet:
    ms = members if k is None else members[:k]
    return SurrogateSet(ms, names=list(ENS[: len(ms)]), **kw)


def _loss(members, ensemble="logit", **kw):
    """The per-sample loss of the logit/loss/prob ensemble of ``members`` (weights in kw)."""
    return _surrogates(members, **kw).bind(Objective(ensemble=ensemble)).loss


def _gradient_attacks() -> list[str]:
    return ATTACKS.names(kind="gradient") + ATTACKS.names(kind="ensemble")


@pytest.fixture(scope="module")
def whitebox(members, test_data):
    """Each ensemble attack (and the logit-ensemble MI-FGSM baseline) at its defaults, 8/255, on
    48 test images. Returns {attack: (ASR on the attacked ensemble, [ASR on each member])}, each
    over the images that classifier gets right."""
    x, y, idx = (t[:48] for t in test_data)
    out = {}
    for name in ("mifgsm", *ENSEMBLE_ATTACKS):
        S = _surrogates(members)
        x_adv = create_attack(name, eps=EPS)(S, x, y, idx)
        with torch.no_grad():
            ok = S.predict(x) == y
            ens = float(((S.predict(x_adv) != y) & ok).sum() / ok.sum())
            rates = []
            for m in members:
                ok = m(x).argmax(1) == y
                rates.append(float(((m(x_adv).argmax(1) != y) & ok).sum() / ok.sum()))
        out[name] = (ens, rates)
    return out


def test_cwa_whitebox_on_its_surrogates(whitebox):
    # The ci-size models (2 epochs on 4000 images, ~40% clean accuracy) are hard to fool even
    # one at a time (single-model MI-FGSM: 84–95% at 8/255), so the 95% bar is checked on
    # the cpu zoo (grids/ensemble.yaml, see the attacks' notes); here: CWA breaks the attacked
    # ensemble, and it raises the *weakest member's* ASR above the logit ensemble's, which is
    # its claim (a common weakness of all members, not a point that fools only the average).
    ens, members = whitebox["cwa"]
    assert ens >= 0.85, whitebox["cwa"]
    assert min(members) > min(whitebox["mifgsm"][1]), whitebox


@pytest.mark.parametrize("name", ["mifgsm", "svre", "adaea", "cwa_sam", "cwa_cse"])
def test_ensemble_attacks_are_strong_white_box(whitebox, name):
    # 10 sign steps inside an 8/255 ball break most of the images the attacked ensemble gets
    # right (measured 0.88–0.91 on 100 images); a broken update (e.g. an ablation that descends
    # the loss) would leave most images correct
    assert whitebox[name][0] >= 0.75, whitebox


@pytest.mark.parametrize("name", _gradient_attacks())
@pytest.mark.parametrize("mode", ["loss", "prob"])  # logit (the default): tests/test_attacks.py
def test_every_attack_stays_in_ball_with_every_ensemble_mode(members, test_data, name, mode):
    x, y, idx = (t[:3] for t in test_data)
    S = _surrogates(members, 2, weights=[2.0, 1.0])
    x_adv = create_attack(name, eps=EPS, steps=2, ensemble=mode)(S, x, y, idx)
    assert x_adv.shape == x.shape
    assert float((x_adv - x).abs().max()) <= EPS + 1e-6
    assert float(x_adv.min()) >= 0.0 and float(x_adv.max()) <= 1.0
    assert float((x_adv - x).abs().max()) > EPS / 4  # it moved


@pytest.mark.parametrize("name", _gradient_attacks())
@pytest.mark.parametrize("k", [1, 3])
def test_grad_evals_match_formula_for_one_and_three_models(members, test_data, name, k):
    x, y, idx = (t[:2] for t in test_data)
    S = _surrogates(members, k)
    attack = create_attack(name, eps=EPS, steps=2)
    assert attack.run(S, x, y, idx).grad_evals == attack.grad_evals_formula(k) > 0


def test_objective_modes_and_weights(members, test_data):
    x, y, _ = (t[:6] for t in test_data)
    with torch.no_grad():
        logits = [m(x) for m in members]
        for mode in ("logit", "loss", "prob"):
            loss = _loss(members, ensemble=mode, weights=[1.0, 0.0, 0.0])
            assert torch.allclose(loss(x, y), F.cross_entropy(logits[0], y, reduction="none"), atol=1e-5)
        w = torch.tensor([0.5, 0.3, 0.2])
        loss = _loss(members, ensemble="loss", weights=w.tolist())
        expect = sum(wi * F.cross_entropy(o, y, reduction="none") for wi, o in zip(w, logits))
        assert torch.allclose(loss(x, y), expect, atol=1e-5)
        loss = _loss(members, ensemble="logit")
        expect = F.cross_entropy(sum(logits) / 3, y, reduction="none")
        assert torch.allclose(loss(x, y), expect, atol=1e-5)
        # per-sample weights (AdaEA): rows equal to the shared weights give the same objective,
        # and a row that selects one model gives that model's loss for that image only
        for mode in ("logit", "loss", "prob"):
            loss = _loss(members, ensemble=mode, weights=w.tolist())
            assert torch.allclose(loss(x, y, weights=w.expand(6, 3)), loss(x, y), atol=1e-6)
        rows = torch.tensor([[1.0, 0, 0]] * 3 + [[0, 0, 1.0]] * 3)
        got = _loss(members)(x, y, weights=rows)
        assert torch.allclose(got[:3], F.cross_entropy(logits[0][:3], y[:3], reduction="none"), atol=1e-5)
        assert torch.allclose(got[3:], F.cross_entropy(logits[2][3:], y[3:], reduction="none"), atol=1e-5)


def test_disagreement_mask_uses_every_model():
    """The public AdaEA leaves the last model's similarity row at zero; ours averages all pairs.
    Models 0 and 1 agree, model 2 opposes both: mean pairwise cosine (1 − 1 − 1)/3 = −1/3."""
    g = torch.randn(2, 3, 4, 4)
    m = disagreement_mask([g, g, -g], threshold=-0.3)
    assert m.shape == (2, 1, 4, 4) and float(m.sum()) == 0.0
    assert float(disagreement_mask([g, g, -g], threshold=-0.4).min()) == 1.0
    assert float(disagreement_mask([g, g, g], threshold=0.99).min()) == 1.0


class _ConstLoss(torch.nn.Module):
    """Logits whose cross-entropy for class 0 is a chosen positive function of the input's mean."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        z = self.scale * x.flatten(1).mean(1, keepdim=True)
        return torch.cat([-z, z], 1)  # CE(class 0) = softplus(2z)


def test_adaea_weights_follow_the_authors_ratio():
    """AGM weights against a hand computation: with L_i(x_j) the loss of member i on member j's
    one-step example, the authors' code scores r_j = Σ_{i≠j} L_i(x_j)/L_i(x_i); version 1 of this
    harness scored mean_{i≠j} L_i(x_j)/L_j(x_j) (kept as ratio: mean_own)."""
    models = [_ConstLoss(s) for s in (1.0, 2.0, 4.0)]
    S = SurrogateSet(models)
    x = torch.full((1, 3, 4, 4), 0.5)
    y = torch.zeros(1, dtype=torch.long)
    grads = [torch.full_like(x, v) for v in (1.0, -1.0, 1.0)]  # members 0 and 2 step up, 1 steps down
    alpha = 8 / 255
    x_step = [(x + alpha * torch.sign(g)).clamp(0, 1) for g in grads]
    L = [[float(F.cross_entropy(models[i](x_step[j]), y)) for i in range(3)] for j in range(3)]
    authors = [sum(L[j][i] / L[i][i] for i in range(3) if i != j) for j in range(3)]
    mean_own = [sum(L[j][i] for i in range(3) if i != j) / 2 / L[j][j] for j in range(3)]
    got = {}
    for ratio, r in (("authors", authors), ("mean_own", mean_own)):
        atk = create_attack("adaea", eps=alpha, steps=1, ratio=ratio)
        got[ratio] = atk.weights(S, x, x, y, grads)[0]
        torch.testing.assert_close(got[ratio], torch.softmax(10.0 * torch.tensor(r), 0), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got["authors"], got["mean_own"], atol=1e-3)  # the case tells them apart
    assert create_attack("adaea").params()["ratio"] == "authors"


def test_cwa_parameters_and_errors():
    from advtransfer.core.errors import UserError

    a = create_attack("cwa", eps=EPS)
    assert a.alpha == pytest.approx(EPS / 5) and a.r == pytest.approx(EPS / 15) and a.steps == 10
    assert create_attack("cwa", eps=EPS, beta=50).params()["beta"] == 50
    with pytest.raises(UserError, match="unknown parameter .betta.; did you mean .beta."):
        create_attack("cwa", eps=EPS, betta=2)
    with pytest.raises(UserError, match="norms"):
        create_attack("cwa", eps=EPS, norm="l1")
    # L2: the inner step defaults to one ε-sized move; a given beta is kept
    a2 = create_attack("cwa", eps=0.5, norm="l2")
    assert a2.extra["beta"] == pytest.approx(0.5) and a2.alpha == pytest.approx(0.1)
    assert create_attack("cwa", eps=0.5, norm="l2", beta=3).extra["beta"] == 3
    assert create_attack("cwa", eps=EPS).extra["beta"] == 2.0  # L∞ default unchanged


@pytest.mark.parametrize("name", ["cwa", "cwa_sam", "cwa_cse"])
def test_l2_cwa_family_is_strong_white_box(members, test_data, name):
    """The L2 variants keep every image in the L2 ball and fool the attacked ensemble at least about
    as often as its L2 MI-FGSM baseline (white-box success is the point of the ensemble step). At
    L2 = 1.5 (about 6/255 per pixel on average) the logit-ensemble MI-FGSM fools ~97% of the ci
    ensemble's correct images and the CWA family 100% (measured; L2 = 0.5 fools only ~65%):
    band 0.85, and no more than 10 points below the baseline."""
    x, y, idx = (t[:32] for t in test_data)
    asr = {}
    for atk in ("mifgsm", name):
        S = _surrogates(members)
        x_adv = create_attack(atk, eps=1.5, norm="l2")(S, x, y, idx)
        assert float((x_adv - x).flatten(1).norm(dim=1).max()) <= 1.5 + 1e-5
        ok = S.predict(x) == y
        asr[atk] = float((S.predict(x_adv)[ok] != y[ok]).float().mean())
    assert asr[name] >= 0.85 and asr[name] >= asr["mifgsm"] - 0.10, asr


def test_grid_budget_grad_evals_matches_cwa(tmp_path):
    """With ``budget: grad_evals`` every attack spends at most CWA's 60 evaluations (10 steps ×
    2 × 3 models), and as many whole steps as fit."""
    import yaml

    from advtransfer.grid import load_grid, resolve_attack

    grid = {"name": "evals", "n": 20, "size": "ci", "eps": ["8/255"], "budget": "grad_evals",
            "defaults": {"grad_evals": 60},
            "attacks": {"ens": {"attack": "mifgsm"}, "ens_a5": {"attack": "mifgsm", "alpha_over_eps": "1/5"},
                        "svre": {}, "adaea": {}, "cwa": {}, "cwa_sam": {}, "cwa_cse": {}},
            "surrogates": [["resnet20_a", "vgg_a", "mobilenet_a"]], "victims": ["resnet20_b"]}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    spec = load_grid(str(tmp_path / "g.yaml"))
    assert spec.budget == "grad_evals"
    got = {e.label: resolve_attack(e, spec, EPS, 0, 3) for e in spec.attacks}
    for label, a in got.items():
        assert 60 - a.grad_evals_formula(3) < a.grad_evals_formula(3) / a.steps, label
    assert got["cwa"].steps == 10 and got["ens"].steps == 20 and got["cwa_cse"].steps == 20
    assert got["ens_a5"].alpha == pytest.approx(EPS / 5) and got["ens"].alpha == pytest.approx(EPS / 20)
