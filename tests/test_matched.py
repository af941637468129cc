"""Matched baselines by construction: a grid with ``matched: [step, evals]`` adds, for every
per-image attack that is not itself the baseline, MI-FGSM on the logit ensemble of the same
surrogate set at the attack's step size with its steps, and with its gradient evaluations."""
from __future__ import annotations

import pytest
import yaml

from advtransfer.attacks import create_attack
from advtransfer.core.errors import UserError
from advtransfer.grid import expand_cells, load_grid

ATTACKS = ["mifgsm", "difgsm", "svre", "adaea", "cwa", "cwa_sam", "cwa_cse", "sgd_uap"]


def _grid(tmp_path, **changes):
    grid = {"name": "m", "n": 20, "size": "ci", "eps": ["4/255", "8/255"], "matched": ["step", "evals"],
            "defaults": {"steps": 10}, "attacks": {a: {} for a in ATTACKS},
            "surrogates": [["resnet20_a", "vgg_a", "mobilenet_a"], "resnet20_a"], "victims": ["resnet20_b"]}
    grid.update(changes)
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(grid))
    return load_grid(str(path))


def _cells(spec):
    return expand_cells(spec, {m: "sha-" + m for m in spec.model_names()})


def test_every_attack_gets_baselines_with_its_step_size_steps_and_evals(tmp_path):
    spec = _grid(tmp_path)
    cells = _cells(spec)
    by_key = {}
    for c in cells:
        if c.attack.match != "none":
            for label in c.attack.baseline_for.split(","):
                by_key.setdefault((c.surrogate.name, label, c.eps), {})[c.attack.match] = c
    attacks = [c for c in cells if c.attack.match == "none"]
    for c in attacks:
        n = len(c.surrogate.models)
        base = by_key.get((c.surrogate.name, c.attack.label, c.eps), {})
        if c.attack.attack in ("mifgsm", "sgd_uap"):
            # the baseline itself gets none, nor does a universal attack (not a per-image kind)
            assert base == {}, c.attack.label
            continue
        assert set(base) == {"step", "evals"}, c.attack.label
        p = c.config["attack_params"]
        a = create_attack(c.attack.attack, **{k: v for k, v in p.items() if k not in ("eps", "seed")}, eps=c.eps)
        for match, b in base.items():
            bp = b.config["attack_params"]
            assert b.config["attack"] == "mifgsm" and bp["ensemble"] == "logit" and bp["momentum"] == 1.0
            assert bp["alpha"] == pytest.approx(p["alpha"]) and bp["eps"] == c.eps and bp["norm"] == p["norm"]
            assert b.config["surrogate"] == c.config["surrogate"] and b.seed == c.seed
            evals_b = bp["steps"] * n   # MI-FGSM: one gradient per model and step
            if match == "step":
                assert bp["steps"] == p["steps"]
            else:
                # as many whole MI-FGSM steps as fit in the attack's evaluations: equal, or less than one step short
                assert a.grad_evals_formula(n) - n < evals_b <= a.grad_evals_formula(n)


def test_shared_baseline_is_one_cell_serving_several_attacks(tmp_path):
    cells = _cells(_grid(tmp_path))
    # cwa, cwa_sam and cwa_cse all step α = ε/5 for 10 steps: one step-matched baseline per (set, ε)
    step = [c for c in cells if c.attack.match == "step" and "cwa" in c.attack.baseline_for
            and c.surrogate.name == "resnet20_a+vgg_a+mobilenet_a" and c.eps == 8 / 255]
    assert len(step) == 1 and set(step[0].attack.baseline_for.split(",")) == {"cwa", "cwa_sam", "cwa_cse"}
    assert len({c.cell_id for c in cells}) == len(cells)


def test_attack_filter_keeps_the_attack_with_its_baselines(tmp_path):
    path = tmp_path / "g.yaml"
    _grid(tmp_path)
    spec = load_grid(str(path), attack="cwa")
    labels = {c.attack.label for c in _cells(spec)}
    assert "cwa" in labels and any(lab.startswith("base_step[") for lab in labels)
    assert any(lab.startswith("base_evals[") for lab in labels) and "svre" not in labels


def test_bad_matched_value_is_one_line(tmp_path):
    with pytest.raises(UserError, match="matched must be a list of step, evals"):
        _grid(tmp_path, matched=["flops"])


def test_a_baseline_takes_the_momentum_and_the_target_rule_the_grid_set(tmp_path):
    """An I-FGSM regime (``defaults: {momentum: 0}``) is matched by I-FGSM, not MI-FGSM, and a
    targeted attack's baseline aims at the same targets; grids that set neither keep their ids."""
    plain = {c.attack.label: c.cell_id for c in _cells(_grid(tmp_path, attacks={"difgsm": {}}))}
    ifgsm = _cells(_grid(tmp_path, attacks={"difgsm": {}}, defaults={"steps": 10, "momentum": 0}))
    bases = [c for c in ifgsm if c.attack.match != "none"]
    assert bases and all(c.config["attack_params"]["momentum"] == 0 and ",mu=0]" in c.attack.label for c in bases)
    assert not set(plain.values()) & {c.cell_id for c in bases}
    assert all("mu=" not in lab for lab in plain)
    tgt = _cells(_grid(tmp_path, attacks={"difgsm": {}}, targeted=True, defaults={"steps": 10, "target": "next"}))
    assert all(c.config["attack_params"].get("target") == "next" for c in tgt)
    rnd = _cells(_grid(tmp_path, attacks={"difgsm": {}}, targeted=True))
    assert all("target" not in c.config["attack_params"] for c in rnd if c.attack.match != "none")
