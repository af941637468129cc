"""Bad input, the way a hostile user gives it: every case is one line on stderr starting with
``advtransfer: error:``, exit code 2, nothing written (the run folder is never created), and it
fails before any model trains (the checks run before training; a case that slipped through would
start training and show up as a slow test and a wrong exit code).

``BAD_INPUTS`` is the list the reliability issue's closing note reports; run this file as a
script (``python tests/test_bad_inputs.py``) to print each case with its message.
"""
from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CI = yaml.safe_load((REPO / "grids" / "ci.yaml").read_text())


def _grid(**changes) -> dict:
    g = {**CI, **changes}
    return {k: v for k, v in g.items() if v is not DROP}


DROP = object()


def _attack(label: str, **params) -> dict:
    return {"attacks": {label: params}}


# (case id, what the user did, grid changes or None, extra CLI args, text the message must contain)
# Grid changes apply to a copy of grids/ci.yaml; "{out}", "{file}", "{data:<kind>}", "{dir}" in the
# arguments are filled in per test (see _materialise).
BAD_INPUTS: list[tuple[str, str, dict | str | None, list[str], str]] = [
    ("unknown-grid", "a grid name with a typo", None, ["grid", "cifar1O"], "did you mean 'cifar10'"),
    ("unknown-attack-flag", "--attack with a typo", None, ["grid", "ci", "--attack", "mifgsn"], "did you mean 'mifgsm'"),
    ("bad-size-flag", "--size that is not a zoo size", None, ["grid", "ci", "--size", "huge"], "--size must be one of ci, cpu"),
    ("n-zero", "-n 0", None, ["grid", "ci", "-n", "0"], "-n must be an integer >= 1"),
    ("n-too-large", "-n beyond the split", None, ["grid", "ci", "-n", "20000"], "outside the 10000 test images"),
    ("device-unknown", "--device tpu9", None, ["grid", "ci", "--device", "tpu9"], "not a torch device"),
    ("device-cuda-absent", "--device cuda on a machine without a GPU", None, ["grid", "ci", "--device", "cuda"],
     "no CUDA GPU"),
    ("device-mps-absent", "--device mps off a Mac", None, ["grid", "ci", "--device", "mps"], "MPS is not available"),
    ("device-kind", "--device meta (a torch device the harness cannot run on)", None,
     ["grid", "ci", "--device", "meta"], "runs on cpu, cuda or mps"),
    ("out-is-file", "--out naming an existing file", None, ["grid", "ci", "--out", "{file}"], "is a file, not a folder"),
    ("out-under-file", "--out inside an existing file", None, ["grid", "ci", "--out", "{file}/run"], "cannot be created"),
    ("out-foreign-dir", "--out a non-empty folder that is not a run folder", None, ["grid", "ci", "--out", "{dir}"],
     "not a run folder"),
    ("data-missing", "--data-dir without the npz files", None, ["grid", "ci", "--data-dir", "{out}-nodata"],
     "lacks train.npz, test.npz"),
    ("data-truncated", "a truncated test.npz", None, ["grid", "ci", "--data-dir", "{data:truncated}"],
     "truncated or corrupt"),
    ("data-not-zip", "a test.npz that is not an npz at all", None, ["grid", "ci", "--data-dir", "{data:garbage}"],
     "truncated or corrupt"),
    ("data-float-pixels", "images stored as float instead of uint8", None, ["grid", "ci", "--data-dir", "{data:float}"],
     "must hold x uint8"),
    ("data-label-range", "labels outside the ten classes", None, ["grid", "ci", "--data-dir", "{data:labels}"],
     "labels must lie in 0..9"),
    ("data-length", "fewer labels than images", None, ["grid", "ci", "--data-dir", "{data:length}"],
     "one label per image"),
    ("yaml-invalid", "a grid that is not YAML", "name: x\neps: [8/255\n", ["grid"], "not valid YAML"),
    ("yaml-list", "a grid that is a list, not a mapping", "- a\n- b\n", ["grid"], "must be a mapping"),
    ("key-typo", "a misspelt grid key", _grid(epss=["8/255"]), ["grid"], "did you mean 'eps'"),
    ("key-missing", "no victims", _grid(victims=DROP), ["grid"], "missing required key 'victims'"),
    ("eps-word", "eps written as a word", _grid(eps=["eight"]), ["grid"], "is not a number"),
    ("eps-range", "an L-inf eps above 1", _grid(eps=[2]), ["grid"], "outside (0, 1]"),
    ("eps-empty", "an empty eps list", _grid(eps=[]), ["grid"], "at least one radius"),
    ("norm", "an unknown norm", _grid(norm="l3"), ["grid"], "norm must be linf or l2"),
    ("attacks-empty", "no attacks", _grid(attacks={}), ["grid"], "non-empty mapping"),
    ("attack-params-list", "attack parameters given as a list", _grid(attacks={"ifgsm": [10]}), ["grid"],
     "must be a mapping"),
    ("attack-seed", "a seed given per attack (seeds belong to the grid)", _grid(**_attack("ifgsm", seed=None)),
     ["grid"], "give it at top level as seeds"),
    ("attack-eps", "an eps given per attack", _grid(**_attack("ifgsm", eps="8/255")), ["grid"],
     "give it at top level as eps"),
    ("grad-evals-word", "grad_evals that is not a whole number", _grid(budget="grad_evals",
                                                                        **_attack("ifgsm", grad_evals="ten")),
     ["grid"], "grad_evals must be a whole number"),
    ("executor-typo", "--executor with a typo", None, ["grid", "ci", "--executor", "locl"], "did you mean 'local'"),
    ("executor-key", "an unknown executor in the grid file", _grid(executor="ray9"), ["grid"],
     "executor must be one of serial, local, submitit"),
    ("precision-cpu", "fp16 on a CPU", None, ["grid", "ci", "--precision", "fp16", "--device", "cpu"],
     "fp16 needs a CUDA device"),
    ("precision-key", "an unknown precision in the grid file", _grid(precision="fp8"), ["grid"],
     "precision must be one of fp32, bf16, fp16"),
    ("compile-flag", "an unknown --compile mode", None, ["grid", "ci", "--compile", "always"],
     "--compile must be one of off, auto"),
    ("vectorise-word", "a vectorise option that is not true/false",
     _grid(surrogates=[{"models": ["resnet20_a"], "vectorise": "yes"}]), ["grid"], "vectorise must be true or false"),
    ("workers-zero", "--workers 0", None, ["grid", "ci", "--executor", "local", "--workers", "0"],
     "workers must be a whole number >= 1"),
    ("profile-missing", "a submitit profile that does not exist", None,
     ["grid", "ci", "--executor", "submitit", "--profile", "{out}-none.yaml"], "does not exist"),
    ("profile-not-submitit", "--profile without the submitit executor", None,
     ["grid", "ci", "--profile", "{file}"], "read by the submitit executor only"),
    ("attack-unknown", "an attack name the registry lacks", _grid(**_attack("mi_fgsm")), ["grid"], "did you mean"),
    ("param-unknown", "an attack parameter with a typo", _grid(**_attack("mifgsm", stepz=5)), ["grid"],
     "did you mean 'steps'"),
    ("steps-zero", "steps 0", _grid(**_attack("mifgsm", steps=0)), ["grid"], "steps must be an integer >= 1"),
    ("steps-word", "steps written as a word", _grid(**_attack("mifgsm", steps="ten")), ["grid"],
     "steps must be an integer >= 1"),
    ("alpha-negative", "a negative step size", _grid(**_attack("mifgsm", alpha="-1/255")), ["grid"],
     "alpha (step size) must be a positive number"),
    ("targeted-word", "targeted: 'yes' (a string)", _grid(**_attack("mifgsm", targeted="yes")), ["grid"],
     "targeted must be true or false"),
    ("param-type-float", "an integer parameter given as 2.5", _grid(**_attack("tifgsm", kernel_size=2.5)), ["grid"],
     "kernel_size must be an integer"),
    ("param-type-word", "a numeric parameter given as a word", _grid(**_attack("difgsm", diversity_prob="often")),
     ["grid"], "diversity_prob must be a finite number"),
    ("ensemble-mode", "an unknown ensemble mode", _grid(**_attack("mifgsm", ensemble="median")), ["grid"],
     "unknown ensemble mode"),
    ("target-class", "a target class outside the ten labels",
     _grid(**_attack("sgd_uap", targeted=True, target_class=12, n_craft=100, batch=50, steps=2)), ["grid"],
     "target_class 12 is outside the label set"),
    ("n-craft", "a universal attack crafting on more training images than exist",
     _grid(**_attack("sgd_uap", n_craft=10 ** 6)), ["grid"], "exceeds the 50000 training images"),
    ("batch-zero", "batch_size 0", _grid(batch_size=0), ["grid"], "batch_size must be an integer >= 1"),
    ("batch-word", "batch_size written as a word", _grid(batch_size="big"), ["grid"], "batch_size must be an integer"),
    ("n-negative", "n -5 in the grid", _grid(n=-5), ["grid"], "n must be an integer >= 1"),
    ("start-negative", "start -1", _grid(start=-1), ["grid"], "start must be an integer >= 0"),
    ("n-start-beyond", "start + n beyond the split", _grid(start=9990, n=100), ["grid"], "outside the 10000 test images"),
    ("seeds-word", "seeds that are not integers", _grid(seeds=["a"]), ["grid"], "seeds must be a list of integers"),
    ("seeds-repeat", "a seed listed twice", _grid(seeds=[0, 0]), ["grid"], "seeds repeat"),
    ("split", "a split CIFAR-10 does not have", _grid(split="val"), ["grid"], "unknown split 'val'"),
    ("size", "an unknown zoo size in the grid", _grid(size="huge"), ["grid"], "size must be one of"),
    ("dataset", "an unknown dataset", _grid(dataset="cifar11"), ["grid"], "did you mean 'cifar10'"),
    ("surrogate-unknown", "a surrogate the zoo lacks", _grid(surrogates=["resnet20_c"]), ["grid"], "resnet20_c"),
    ("victim-unknown", "a victim the zoo lacks", _grid(victims=["vgg_z"]), ["grid"], "vgg_z"),
    ("weights-length", "ensemble weights of the wrong length",
     _grid(surrogates=[{"models": ["resnet20_a", "vgg_a"], "weights": [1.0]}]), ["grid"], "weights must be a list of 2"),
    ("weights-negative", "a negative ensemble weight",
     _grid(surrogates=[{"models": ["resnet20_a", "vgg_a"], "weights": [1.0, -1.0]}]), ["grid"], "non-negative"),
    ("surrogate-option", "an unknown surrogate option",
     _grid(surrogates=[{"models": ["resnet20_a"], "per_stepp": 2}]), ["grid"], "unknown surrogate options"),
    ("replicates-zero", "replicates 0", _grid(replicates=0), ["grid"], "replicates must be a positive integer"),
    ("matched-unknown", "an unknown matching kind", _grid(matched=["cost"]), ["grid"], "matched must be a list of"),
    ("reference-unknown", "a reference that is not a surrogate", _grid(reference="vgg_b"), ["grid"],
     "reference must name one of the grid's surrogates"),
    ("plot-missing", "plot on a folder that does not exist", None, ["plot", "{out}"], "does not exist"),
    ("report-missing", "report on a folder that does not exist", None, ["report", "{out}"], "does not exist"),
    ("distortion-missing", "distortion on a folder that does not exist", None, ["distortion", "{out}"],
     "does not exist"),
    ("distortion-cap", "distortion with a negative cap", None, ["distortion", "{dir}", "--cap", "-1"],
     "--cap must be positive"),
    ("distortion-budget", "distortion with a budget that is not a number", None,
     ["distortion", "{dir}", "--blackbox-budgets", "100,lots"], "--blackbox-budgets"),
    ("gen-conditional-untargeted", "a multi-target generator with targeted: false",
     _grid(**_attack("cgnc", targeted=False)), ["grid"], "needs targeted: true"),
    ("gen-feature-targeted", "BIA (a feature-distance loss) with targeted: true",
     _grid(**_attack("bia", targeted=True)), ["grid"], "is untargeted"),
    ("gen-pdcl-no-clip", "PDCL without a CLIP model", _grid(**_attack("pdcl")), ["grid"], "needs clip"),
    ("gen-clip-not-clip", "a generator's clip: naming a CIFAR net",
     _grid(**_attack("pdcl", clip="resnet20_a")), ["grid"], "is not an open_clip model"),
    ("gen-clip-unknown", "a generator's clip: naming no zoo entry",
     _grid(**_attack("cgnc", cond="clip", clip="clip_vit_b23")), ["grid"], "did you mean"),
    ("gen-n-craft-too-large", "a generator trained on more images than the training split",
     _grid(**_attack("cda", n_craft=60000)), ["grid"], "exceeds the"),
    ("gen-width-zero", "a generator of width 0", _grid(**_attack("cda", width=0)), ["grid"],
     "width must be an integer >= 1"),
    # checked against the cell before any model trains (the ci zoo is untrained here)
    ("layer-unknown", "a feature-level attack naming a layer the surrogate lacks",
     _grid(**_attack("fia", layer="net.nope.9")), ["grid"], "unknown layer 'net.nope.9'"),
    ("target-outside-labels", "a fixed target class outside the ten labels",
     _grid(**_attack("mifgsm", targeted=True, target=42)), ["grid"], "target 42 is outside the label set 0..9"),
    ("layers-unknown", "DTA naming a layer list with one the surrogate lacks",
     _grid(**_attack("dta", layers=["net.layers.1", "net.layers.99"])), ["grid"], "unknown layer 'net.layers.99'"),
    # a run folder whose files were damaged (a disk filled up, a copy cut short): one line naming the file
    ("compare-damaged", "compare on a run whose results.parquet is damaged", None, ["compare", "{run:results}"],
     "results.parquet is unreadable"),
    ("compare-two-damaged", "compare against a second run whose results.parquet is damaged", None,
     ["compare", "{run:results}", "{run:results}"], "results.parquet is unreadable"),
    ("report-damaged", "report on a run whose results.parquet is damaged", None, ["report", "{run:results}"],
     "results.parquet is unreadable"),
    ("report-manifest-damaged", "report on a run whose manifest.json is damaged", None, ["report", "{run:manifest}"],
     "manifest.json is unreadable"),
    ("report-table-damaged", "report on a run whose distortion.parquet (a measure's table) is damaged", None,
     ["report", "{run:distortion}"], "distortion.parquet is unreadable"),
    ("plot-damaged", "plot on a run whose results.parquet is damaged", None, ["plot", "{run:results}"],
     "results.parquet is unreadable"),
    ("distortion-damaged", "distortion on a run whose results.parquet is damaged", None,
     ["distortion", "{run:results}"], "results.parquet is unreadable"),
    ("golden-damaged", "golden --check of a run whose results.parquet is damaged", None,
     ["golden", "{run:results}", "--check"], "results.parquet is unreadable"),
    ("dumb-damaged", "dumb on a run whose results.parquet is damaged", None, ["dumb", "{run:results}"],
     "results.parquet is unreadable"),
    ("lineage-damaged", "lineage on a run whose results.parquet is damaged", None, ["lineage", "{run:results}"],
     "results.parquet is unreadable"),
    ("whitebox-match-damaged", "whitebox-match with a damaged ladder run", None,
     ["whitebox-match", "{run:results}", "--ladder", "{run:results}", "--attack", "mifgsm"],
     "results.parquet is unreadable"),
    # pas checks every argument before it trains the surrogate and the validators
    ("pas-validator-unknown", "pas with a validator the zoo lacks", None,
     ["pas", "resnet20_a", "--validators", "vgg_z", "--search", "random"], "vgg_z"),
    ("pas-budget-zero", "pas with --budget 0", None,
     ["pas", "resnet20_a", "--validators", "vgg_a", "--budget", "0", "--search", "random"], "--budget must be >= 1"),
    ("pas-n-too-large", "pas scoring on more images than the training split", None,
     ["pas", "resnet20_a", "--validators", "vgg_a", "--n", "1000000", "--search", "random"], "exceeds the"),
    ("pas-eps-range", "pas with a step above 1", None,
     ["pas", "resnet20_a", "--validators", "vgg_a", "--eps", "8", "--search", "random"], "outside (0, 1]"),
    ("pas-out-folder", "pas --out in a folder that does not exist", None,
     ["pas", "resnet20_a", "--validators", "vgg_a", "--search", "random", "--out", "{out}/paths.json"],
     "does not exist"),
    ("compare-out-file", "compare --out naming an existing file", None, ["compare", "{run:results}", "--out", "{file}"],
     "is a file, not a folder"),
    ("report-out-under-file", "report --out inside an existing file", None, ["report", "{run:results}", "--out", "{file}/r"],
     "lies under the file"),
    ("knowledge-out-file", "knowledge --out naming an existing file", None, ["knowledge", "--out", "{file}"],
     "is a file"),
    ("knowledge-unknown", "knowledge of a model the zoo lacks", None, ["knowledge", "resnet21_a", "--out", "{out}"],
     "did you mean"),
    ("zoo-unknown", "zoo train of a model the zoo lacks", None, ["zoo", "train", "resnet21_a"], "did you mean"),
    ("env-size", "ADVTRANSFER_SIZE set to a size that does not exist", None, ["zoo", "list"], "ADVTRANSFER_SIZE"),
    ("env-device", "ADVTRANSFER_DEVICE set to a device that does not exist", None, ["grid", "ci"], "ADVTRANSFER_DEVICE"),
]

ENV = {"env-size": {"ADVTRANSFER_SIZE": "huge"}, "env-device": {"ADVTRANSFER_DEVICE": "tpu9"}}


def _write_npz(folder: Path, kind: str) -> Path:
    """A data folder whose test.npz is damaged in one way (train.npz a valid tiny file)."""
    folder.mkdir(parents=True, exist_ok=True)
    x = np.zeros((20, 32, 32, 3), np.uint8)
    y = np.arange(20, dtype=np.int64) % 10
    np.savez(folder / "train.npz", x=x, y=y)
    test = folder / "test.npz"
    if kind == "truncated":
        np.savez(test, x=x, y=y)
        test.write_bytes(test.read_bytes()[:300])
    elif kind == "garbage":
        test.write_bytes(b"this is not a zip file\n" * 10)
    elif kind == "float":
        np.savez(test, x=x.astype(np.float32), y=y)
    elif kind == "labels":
        np.savez(test, x=x, y=y + 5)
    elif kind == "length":
        np.savez(test, x=x, y=y[:10])
    return folder


def _damaged_run(folder: Path, part: str) -> Path:
    """A run folder (results.parquet, manifest.json) with one file damaged: ``results`` a
    results.parquet cut short, ``manifest`` a manifest.json that is not JSON, any other ``part`` a
    ``<part>.parquet`` cut short (a measure's table)."""
    import pandas as pd

    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"cell_id": ["c1"], "surrogate": ["resnet20_a"], "victim": ["vgg_a"], "attack_label": ["ifgsm"],
                  "asr": [0.5]}).to_parquet(folder / "results.parquet")
    (folder / "manifest.json").write_text('{"grid": {"name": "ci"}}')
    if part == "results":
        (folder / "results.parquet").write_bytes((folder / "results.parquet").read_bytes()[:200])
    elif part == "manifest":
        (folder / "manifest.json").write_text('{"grid": {"name": "ci"')
    else:  # a complete run (tests/test_compare.py's, compared) with a table a measure wrote beside it cut short
        from test_compare import make_run

        from advtransfer.analysis.measures.compare import refresh_comparisons

        make_run(folder)
        refresh_comparisons(folder)
        (folder / f"{part}.parquet").write_bytes((folder / "results.parquet").read_bytes()[:200])
    return folder


def _materialise(tmp: Path, grid, args: list[str]) -> list[str]:
    out = tmp / "out"
    (tmp / "a-file").write_text("not a folder\n")
    foreign = tmp / "foreign"
    foreign.mkdir(exist_ok=True)
    (foreign / "notes.txt").write_text("mine\n")
    filled = []
    for a in args:
        if a.startswith("{data:"):
            a = str(_write_npz(tmp / f"data-{a[6:-1]}", a[6:-1]))
        if a.startswith("{run:"):
            a = str(_damaged_run(tmp / f"run-{a[5:-1]}", a[5:-1]))
        filled.append(a.replace("{out}", str(out)).replace("{file}", str(tmp / "a-file")).replace("{dir}", str(foreign)))
    if grid is not None:
        g = tmp / "grid.yaml"
        g.write_text(grid if isinstance(grid, str) else yaml.safe_dump(grid, sort_keys=False))
        filled.insert(1, str(g))
    if filled[0] == "grid" and "--out" not in filled:
        filled += ["--out", str(out)]
    if filled[0] == "grid":
        filled.append("--no-progress")
    return filled


def run_case(tmp: Path, grid, args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, list[Path]]:
    """(exit code, stderr, files under tmp written by the command) for one case, in-process."""
    from advtransfer.cli import main
    from advtransfer.core.utils import temp_env

    argv = _materialise(tmp, grid, args)
    before = {p for p in tmp.rglob("*")}
    err, out = io.StringIO(), io.StringIO()
    with temp_env(**(env or {})), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main(argv)
    written = sorted(p for p in tmp.rglob("*") if p not in before)
    return rc, err.getvalue(), written


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_nothing_written(case, tmp_path):
    cid, _what, grid, args, match = case
    import torch

    if cid == "device-cuda-absent" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    if cid == "device-mps-absent" and torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    rc, err, written = run_case(tmp_path, grid, args, ENV.get(cid))
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("advtransfer: error:"), err
    assert match in lines[0], lines[0]
    assert written == [], f"bad input must write nothing: {written}"


def test_the_list_is_long_enough():
    assert len({c[0] for c in BAD_INPUTS}) == len(BAD_INPUTS) >= 30


if __name__ == "__main__":  # the closing note's table: case, what the user did, the message
    import tempfile

    sys.path.insert(0, str(REPO))
    for cid, what, grid, args, _m in BAD_INPUTS:
        with tempfile.TemporaryDirectory() as d:
            rc, err, _w = run_case(Path(d), grid, args, ENV.get(cid))
        print(f"| {what} | {rc} | `{err.strip()}` |")
