"""The grid spec is the single source of truth: one ``GridSpec.validate()`` judges a spec however
it was made (file, Python, CLI flags through ``with_overrides``), ``run_grid`` and ``plan_grid``
run the preflight themselves, and ``reference`` is a field the manifest carries."""
from __future__ import annotations

import ast
import re
from dataclasses import FrozenInstanceError, replace
from pathlib import Path

import pytest
import torch
import yaml

from advtransfer.core.errors import UserError
from advtransfer.grid import AttackEntry, GridSpec, SurrogateEntry, expand_cells, load_grid

PKG = Path(__file__).resolve().parent.parent / "advtransfer"


def _spec(**changes) -> GridSpec:
    """A small valid spec built in Python (no file)."""
    base = GridSpec(name="py", dataset="cifar10", split="test", n=20, start=0, size="ci", batch_size=20, seeds=[0],
                    norm="linf", eps=[8 / 255], targeted=False, budget="steps",
                    attacks=[AttackEntry("mifgsm", "mifgsm", {"steps": 2})],
                    surrogates=[SurrogateEntry(("resnet20_a",))], victims=["resnet20_b"])
    return replace(base, **changes)


def test_a_valid_python_spec_validates_and_is_frozen():
    spec = _spec()
    assert spec.validate() is spec
    with pytest.raises(FrozenInstanceError):
        spec.n = 5  # type: ignore[misc]


@pytest.mark.parametrize("changes, message", [
    ({"size": "huge"}, "size must be one of ci, cpu, converged, full, not 'huge'"),
    ({"precision": "fp8"}, "precision must be one of fp32, bf16, fp16"),
    ({"compile": "always"}, "compile must be one of off, auto"),
    ({"executor": "locl"}, "did you mean 'local'"),
    ({"workers": 0}, "workers must be a whole number >= 1"),
    ({"n": 0}, "n must be an integer >= 1"),
    ({"start": -1}, "start must be an integer >= 0"),
    ({"batch_size": "big"}, "batch_size must be an integer >= 1"),
    ({"seeds": [1, 1]}, "seeds repeat"),
    ({"eps": [2.0]}, "outside (0, 1]"),
    ({"eps": ["8/255"]}, "is not a number"),
    ({"norm": "l3"}, "norm must be linf or l2"),
    ({"targeted": "yes"}, "targeted must be true or false"),
    ({"budget": "grad_evals"}, "budget grad_evals needs 'grad_evals: N' for attack 'mifgsm'"),
    ({"matched": ("cost",)}, "matched must be a list of step, evals"),
    ({"reference": "vgg_a"}, "reference must name one of the grid's surrogates"),
    ({"victims": []}, "victims must be a non-empty list"),
    ({"attacks": [AttackEntry("mifgsm", "mifgsm", {"seed": 1})]}, "give it at top level as seeds"),
    ({"surrogates": [SurrogateEntry(("resnet20_a", "vgg_a"), weights=(1.0,))]}, "weights must be a list of 2"),
    ({"surrogates": [SurrogateEntry(("resnet20_a",), options=(("per_stepp", 2),))]}, "unknown surrogate options"),
    ({"victims": ["vgg_z"]}, "vgg_z"),
])
def test_validate_judges_a_spec_built_in_python(changes, message):
    with pytest.raises(UserError, match=re.escape(message)):
        _spec(**changes).validate()


def test_with_overrides_names_the_flag_and_leaves_the_original():
    spec = _spec()
    assert spec.with_overrides(size=None, n=None) == spec  # None: the field as it is
    smaller = spec.with_overrides(n=10, compile="auto")
    assert (smaller.n, smaller.compile, spec.n, spec.compile) == (10, "auto", 20, "off")
    with pytest.raises(UserError, match=r"^--size must be one of .*not 'huge'"):
        spec.with_overrides(size="huge")
    with pytest.raises(UserError, match=r"^-n must be an integer >= 1, got 0"):
        spec.with_overrides(n=0)
    with pytest.raises(TypeError, match="with_overrides"):
        spec.with_overrides(name="other")


def test_with_overrides_selects_attacks_and_keeps_cell_ids(tmp_path):
    grid = {"name": "o", "n": 20, "size": "ci", "eps": ["8/255"], "defaults": {"steps": 3},
            "attacks": {"ifgsm": {}, "mi": {"attack": "mifgsm"}}, "surrogates": ["resnet20_a"],
            "victims": ["resnet20_b"]}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    spec = load_grid(str(tmp_path / "g.yaml"))
    shas = {m: "sha-" + m for m in spec.model_names()}
    ids = {c.attack.label: c.cell_id for c in expand_cells(spec, shas)}
    only = spec.with_overrides(attack="mifgsm,pgd")  # a listed attack by name, and one the grid lacks
    assert [a.label for a in only.attacks] == ["mi", "pgd"] and only.attacks[1].params == {"steps": 3}
    assert {c.attack.label: c.cell_id for c in expand_cells(only, shas)}["mi"] == ids["mi"]
    assert {c.cell_id for c in expand_cells(spec.with_overrides(workers=2, executor="local"), shas)} == set(ids.values())


def test_per_size_attack_parameters_apply_at_that_size_only(tmp_path):
    """A PAS path searched on the converged zoo is used there; the cpu zoo keeps the grid's path."""
    grid = {"name": "s", "n": 20, "size": "cpu", "eps": ["8/255"], "defaults": {"steps": 3},
            "attacks": {"pas_r20": {"attack": "pas", "gammas": [0.8, 1.0, 1.0], "deltas": [0.75, 1.0, 1.0],
                                    "sizes": {"converged": {"gammas": [0.5, 0.5, 1.0]}}}},
            "surrogates": ["resnet20_a"], "victims": ["resnet20_b"]}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    spec = load_grid(str(tmp_path / "g.yaml"))
    conv = spec.with_overrides(size="converged")
    shas = {m: "sha-" + m for m in spec.model_names()}  # the same weights: only the parameters differ
    [cpu_cell], [conv_cell] = expand_cells(spec, shas), expand_cells(conv, shas)
    assert cpu_cell.config["attack_params"]["gammas"] == [0.8, 1.0, 1.0]
    assert conv_cell.config["attack_params"]["gammas"] == [0.5, 0.5, 1.0]
    assert conv_cell.config["attack_params"]["deltas"] == [0.75, 1.0, 1.0]  # not replaced: kept
    assert "sizes" not in conv_cell.config["attack_params"] and conv_cell.cell_id != cpu_cell.cell_id
    for sizes, message in [({"huge": {"steps": 2}}, "names 'huge', not a zoo size"),
                           ({"converged": {"targeted": True}}, "may not set targeted"),
                           ({"converged": 3}, "sizes must map a zoo size to parameters")]:
        bad = replace(spec, attacks=[AttackEntry("m", "mifgsm", {"steps": 2, "sizes": sizes})])
        with pytest.raises(UserError, match=re.escape(message)):
            bad.validate()


def test_a_surrogates_attack_list_can_differ_per_size(tmp_path):
    """The converged vgg_a (airbench) has GELUs where the cpu VGG has ReLUs: its row drops LinBP at
    that size only; at cpu its cells are those of the row without `sizes` (the list enters no cell id)."""
    grid = {"name": "s", "n": 20, "size": "cpu", "eps": ["8/255"], "defaults": {"steps": 3},
            "attacks": {"linbp": {}, "ila": {}},
            "surrogates": [{"models": ["vgg_a"], "name": "vgg_a", "attacks": ["linbp", "ila"],
                            "sizes": {"converged": {"attacks": ["ila"]}}}],
            "victims": ["resnet20_b"]}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    spec = load_grid(str(tmp_path / "g.yaml"))
    shas = {m: "sha-" + m for m in spec.model_names()}
    cpu = {c.attack.label: c.cell_id for c in expand_cells(spec, shas)}
    conv = {c.attack.label: c.cell_id for c in expand_cells(spec.with_overrides(size="converged"), shas)}
    assert set(cpu) == {"linbp", "ila"} and set(conv) == {"ila"}
    assert not spec.surrogates[0].options  # `sizes` is not a collection option
    plain = dict(grid, surrogates=[{k: v for k, v in grid["surrogates"][0].items() if k != "sizes"}])
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(plain))
    assert {c.attack.label: c.cell_id for c in expand_cells(load_grid(str(tmp_path / "plain.yaml")), shas)} == cpu
    ci = {c.attack.label for c in expand_cells(spec.with_overrides(size="ci"), shas)}
    assert ci == {"linbp", "ila"}  # a size the entry does not name keeps its `attacks`
    for sizes, message in [({"huge": {"attacks": ["ila"]}}, "names 'huge', not a zoo size"),
                           ({"converged": {"steps": 2}}, "sizes must map a zoo size to {attacks: [...]}"),
                           ({"converged": {"attacks": []}}, "sizes.converged.attacks must be a non-empty list"),
                           ({"converged": {"attacks": ["nosuchattack"]}}, "nosuchattack")]:
        bad = dict(grid, surrogates=[dict(grid["surrogates"][0], sizes=sizes)])
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
        with pytest.raises(UserError, match=re.escape(message)):
            load_grid(str(tmp_path / "bad.yaml"))


def test_reference_is_a_field_and_the_manifest_carries_it(tmp_path):
    from advtransfer.run.store import RunStore

    grid = {"name": "r", "n": 20, "size": "ci", "eps": ["8/255"], "attacks": {"ifgsm": {}}, "reference": "vgg_a",
            "surrogates": ["resnet20_a", "vgg_a"], "victims": ["resnet20_b"]}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    assert load_grid(str(tmp_path / "g.yaml")).reference == "vgg_a"
    store = RunStore(tmp_path / "new")
    store.write_manifest({"reference": "vgg_a", "grid": {}})
    assert store.read_manifest()["reference"] == "vgg_a"
    old = RunStore(tmp_path / "old")  # written before the field: the raw grid still says it
    old.write_manifest({"grid": {"reference": "resnet20_a"}})
    assert old.read_manifest()["reference"] == "resnet20_a"


def test_run_grid_runs_the_preflight_before_training_or_writing(tmp_path, monkeypatch):
    """From Python, as from the CLI: bad input is one UserError before a model trains or a
    folder is made (training is forbidden here, so a check that came late would fail loudly)."""
    from advtransfer.run import runner
    from advtransfer.run.context import RunContext

    def no_training(*_a, **_k):
        raise AssertionError("trained before the preflight")

    monkeypatch.setattr(runner.zoo, "ensure_trained", no_training)
    out = tmp_path / "run"
    for spec, message in [(_spec(n=20000), "outside the 10000 test images"),
                          (_spec(precision="fp16"), "fp16 needs a CUDA device"),
                          (_spec(attacks=[AttackEntry("mifgsm", "mifgsm", {"stepz": 2})]), "did you mean 'steps'"),
                          (_spec(size="huge"), "size must be one of"),
                          # a VGG has no residual block for SGM to decay: refused before any cell runs
                          (_spec(attacks=[AttackEntry("sgm", "sgm", {"steps": 2})], surrogates=[SurrogateEntry(("vgg_a",))]),
                           "sgm finds no site to change in vgg_a (vgg) at size ci")]:
        with pytest.raises(UserError, match=re.escape(message)):
            runner.run_grid(spec, RunContext(out, progress=False), log=lambda *_: None)
        with pytest.raises(UserError, match=re.escape(message)):
            runner.plan_grid(spec, out)
        assert not out.exists()
    runner.plan_grid(_spec(attacks=[AttackEntry("sgm", "sgm", {"steps": 2}), AttackEntry("linbp", "linbp", {"steps": 2})],
                           surrogates=[SurrogateEntry(("resnet20_a",)), SurrogateEntry(("resnet20_a", "vgg_a"))]), out)
    assert not out.exists()  # the check passes where a surrogate has a site (one member of an ensemble suffices)
    with pytest.raises(UserError, match="--executor must be one of"):
        runner.run_grid(_spec(), RunContext(out, progress=False), executor="ray", log=lambda *_: None)
    with pytest.raises(UserError, match="read by the submitit executor only"):
        runner.run_grid(_spec(), RunContext(out, progress=False, profile=str(tmp_path / "p.yaml")), log=lambda *_: None)
    assert not out.exists()


def test_the_cli_checks_no_grid_value_itself():
    """size, compile, precision and executor are judged by GridSpec.validate only: the CLI, the
    executors and accel hold no second copy of those checks."""
    cli = [str(p.relative_to(PKG)) for p in sorted((PKG / "cli").glob("*.py"))]  # one module per command
    for name in (*cli, "run/executors.py", "core/accel.py", "run/validate.py", "run/runner.py"):
        tree = ast.parse((PKG / name).read_text())
        compared = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)
                    and any(isinstance(op, (ast.In, ast.NotIn)) for op in n.ops)
                    and any(isinstance(c, ast.Name) and c.id in ("SIZES", "COMPILE_MODES", "PRECISIONS", "EXECUTORS")
                            for c in n.comparators)]
        assert not compared, f"{name}:{compared[0].lineno} checks a grid value GridSpec.validate checks"


def test_the_run_spec_shares_the_grid_specs_defaults_and_records_the_overrides():
    """RunSpec holds the defaults of GridSpec's plain fields (one copy); a spec's view is its values
    after the CLI's flags and survives the manifest's JSON unchanged."""
    import json

    from advtransfer.grid import RunSpec

    for name in RunSpec.field_names():
        try:
            default = RunSpec.field_default(name)
        except KeyError:
            with pytest.raises(KeyError):
                GridSpec.field_default(name)
            continue
        grid_default = GridSpec.field_default(name)
        assert (list(grid_default) if name == "seeds" else grid_default) == (list(default) if name == "seeds" else default)
    view = _spec().with_overrides(n=10, size="cpu").run_spec()
    assert (view.n, view.size, view.eps, view.victims, view.seeds) == (10, "cpu", (8 / 255,), ("resnet20_b",), (0,))
    back = RunSpec.from_manifest({"spec": json.loads(json.dumps(view.to_dict())), "grid": {"n": 20}})
    assert back == view  # the resolved spec wins over the raw grid file


def test_a_manifest_from_before_the_spec_reads_its_raw_grid_with_the_defaults():
    from advtransfer.grid import RunSpec

    old = {"grid": {"eps": ["4/255", "8/255"], "victims": ["vgg_a"], "n": 50, "seeds": 3, "matched": "step",
                    "plugins": None, "attacks": {"ifgsm": {}}},
           "grid_file": "grids/older.yaml"}
    spec = RunSpec.from_manifest(old)
    assert (spec.name, spec.eps, spec.victims, spec.n, spec.seeds, spec.matched, spec.plugins) == (
        "older", (4 / 255, 8 / 255), ("vgg_a",), 50, (3,), ("step",), ())
    for key in ("dataset", "split", "start", "batch_size", "norm", "precision"):
        assert getattr(spec, key) == GridSpec.field_default(key)
    assert RunSpec.from_manifest({}).n == GridSpec.field_default("n")  # no manifest: the defaults


def test_eval_images_are_the_cell_runners_subset_and_held_out_images_follow_it():
    from advtransfer.data import eval_subset, load_dataset

    view = _spec(n=12, start=5).run_spec()
    x, y, index = view.eval_images()
    ex, ey, eindex = eval_subset(load_dataset("cifar10", "test"), 12, 5)
    assert torch.equal(x, ex) and torch.equal(y, ey) and index.tolist() == list(range(5, 17))
    hx, _hy, hindex = view.held_out_images(4)
    assert hindex.tolist() == [17, 18, 19, 20] and hx.shape[1:] == x.shape[1:]
    assert len(_spec(n=9990, start=8).run_spec().held_out_images(4)[2]) == 2  # the split ends
    assert len(_spec(n=10000).run_spec().held_out_images(4)[0]) == 0


def test_set_changes_grid_keys_before_the_file_is_read(tmp_path, capsys):
    """``--set KEY.PATH=VALUE``: mappings merge key by key, other values replace the file's; the run
    gets its own name (so its own default folder) and its record; bad strings are one line, exit 2."""
    from advtransfer.cli import main
    from advtransfer.grid.load import apply_sets, parse_sets

    sets = parse_sets(["eps=[16/255]", "defaults.steps=50", "attacks.ti3={attack: tifgsm, kernel_size: 3}", "n=12"])
    assert sets == {"eps": ["16/255"], "defaults": {"steps": 50}, "attacks": {"ti3": {"attack": "tifgsm", "kernel_size": 3}},
                    "n": 12}
    raw = {"eps": ["8/255"], "defaults": {"steps": 10, "alpha_over_eps": 0.1}, "attacks": {"mifgsm": {}}}
    out = apply_sets(raw, sets)
    assert out["defaults"] == {"steps": 50, "alpha_over_eps": 0.1} and set(out["attacks"]) == {"mifgsm", "ti3"}
    assert raw["defaults"]["steps"] == 10  # the file's mapping is left as it was
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"name": "g", "n": 20, "size": "ci", "eps": ["8/255"], "defaults": {"steps": 10},
                                    "attacks": {"mifgsm": {}}, "surrogates": ["resnet20_a"], "victims": ["resnet20_b"]}))
    spec = load_grid(str(path), sets=["eps=[16/255]", "defaults.steps=50", "attacks.ti3={attack: tifgsm, kernel_size: 3}"])
    assert spec.eps == [16 / 255] and spec.name.startswith("g@set-") and spec.raw["x-set"][0] == "eps=[16/255]"
    assert {a.label: a.params["steps"] for a in spec.attacks} == {"mifgsm": 50, "ti3": 50}
    assert load_grid(str(path), sets=["name=wide", "n=12"]).name == "wide"
    assert load_grid(str(path), sets=["n=12"]).name != load_grid(str(path), sets=["n=13"]).name
    for bad, msg in ((["eps"], "write KEY=VALUE"), (["eps=[1/2"], "the value is not YAML"),
                     (["defaults=3", "defaults.steps=2"], "set its keys or the whole value")):
        with pytest.raises(UserError, match=re.escape(msg)):
            parse_sets(bad)
    assert main(["grid", str(path), "--set", "eps", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "write KEY=VALUE" in err[0]
    assert main(["grid", str(path), "--set", "defaults.steps=-3", "--dry-run"]) == 2  # the spec's own check
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
