"""Preflight as a property: for every registered attack and every parameter it declares
(:class:`advtransfer.attacks.params.Param`), a value the declaration does not take makes
``advtransfer grid`` stop with one ``advtransfer: error:`` line naming that parameter, exit 2,
before any model trains, any example is crafted or any file is written.

Each case starts from a grid that passes the preflight (the attack's own valid base, checked
first, so the refusal is the drawn value's doing), sets one parameter to a value drawn from what
its declaration excludes (wrong type, out of range, not a choice, a layer the surrogate lacks, a
class beyond the dataset's ten, more training images than the split holds), and runs the real
``grid`` command in-process on the untrained ``ci`` zoo. Spies stand in for the trainer, the
crafting and the run store: a value that slipped through would reach one of them and fail the
test at once (never train for minutes). ``eps`` and ``seed`` are grid-level keys (a grid refuses
them per attack: tests/test_bad_inputs.py), so they are drawn for the Python API instead.
"""
from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advtransfer.attacks import ATTACKS, create_attack
from advtransfer.attacks.params import Param
from advtransfer.core.errors import UserError

REPO = Path(__file__).resolve().parent.parent
CI = yaml.safe_load((REPO / "grids" / "ci.yaml").read_text())
#: one harness-trained surrogate (so layer names are judged), one victim, one radius
BASE_GRID = {**CI, "n": 20, "eps": ["8/255"], "surrogates": ["resnet20_a"], "victims": ["resnet20_b"],
             "defaults": {}}
#: per attack, parameters that make a grid with it valid (multi-target generators are targeted;
#: PDCL needs its CLIP model)
VALID_BASE: dict[str, dict] = {"cgnc": {"targeted": True}, "dual_flow": {"targeted": True},
                               "pdcl": {"clip": "clip_vit_b32"}}
GRID_LEVEL = ("eps", "seed")  # per attack, a grid refuses them whatever their value
NUM_CLASSES, N_TRAIN = 10, 50_000


def _below(p: Param) -> st.SearchStrategy:
    lo = p.lo
    below = st.floats(max_value=lo, exclude_max=not p.lo_open, allow_nan=False, allow_infinity=False)
    return below.map(lambda v: int(math.floor(v)) - (0 if math.floor(v) < lo or p.lo_open else 1)) \
        if p.kind in ("int", "class") else below


def _above(p: Param) -> st.SearchStrategy:
    hi = p.hi
    above = st.floats(min_value=hi, exclude_min=not p.hi_open, allow_nan=False, allow_infinity=False,
                      max_value=1e12)
    return above.map(lambda v: int(math.ceil(v)) + (0 if math.ceil(v) > hi or p.hi_open else 1)) \
        if p.kind in ("int", "class") else above


def invalid_values(p: Param) -> st.SearchStrategy:
    """Values the declaration ``p`` does not take (statically, or in the ci cell: ten classes,
    50,000 training images, a harness ResNet-20's layer names)."""
    words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
    out: list[st.SearchStrategy] = []
    if not p.none_ok:
        out.append(st.none())
    k = p.kind
    if k in ("int", "class"):
        out += [st.floats(allow_nan=False, allow_infinity=False).filter(lambda v: not float(v).is_integer()),
                words, st.booleans(), st.lists(st.integers(), max_size=2)]
        if p.lo is not None:
            out.append(_below(p))
        if p.hi is not None:
            out.append(_above(p))
        if k == "class":
            out += [st.integers(max_value=-1), st.integers(min_value=NUM_CLASSES, max_value=10**9)]
        if p.within == "train_images":
            out.append(st.integers(min_value=N_TRAIN + 1, max_value=10**9))
    elif k == "number":
        out += [words, st.booleans(), st.sampled_from([float("nan"), float("inf"), "-inf", "1/0", "2/x"]),
                st.lists(st.floats(), min_size=1, max_size=2)]
        if p.lo is not None:
            out.append(_below(p))
        if p.hi is not None:
            out.append(_above(p))
    elif k == "bool":
        out += [st.integers(), words, st.sampled_from(["true", "yes", 1, 0])]
    elif k == "choice":
        out += [words.filter(lambda w: w not in p.choices), st.booleans(), st.lists(words, max_size=2)]
    elif k in ("text", "model"):
        out += [st.integers(), st.booleans(), st.lists(words, max_size=2)]
    elif k == "numbers":
        good = st.floats(min_value=p.lo if p.lo is not None else -1e6, max_value=p.hi if p.hi is not None else 1e6,
                         exclude_min=p.lo_open, exclude_max=p.hi_open, allow_nan=False)
        bad_item = st.one_of(_below(p) if p.lo is not None else st.nothing(),
                             _above(p) if p.hi is not None else st.nothing(), words)
        n = p.length or 2
        out += [good, words, st.just([])]
        out.append(st.tuples(st.lists(good, min_size=n - 1, max_size=n - 1), bad_item).map(lambda t: [*t[0], t[1]]))
        if p.length:
            out.append(st.lists(good, min_size=p.length + 1, max_size=p.length + 3))
    elif k == "layer":
        out += [words.map(lambda w: f"net.{w}.9"), st.integers(), st.just(""), st.lists(words, max_size=2)]
    elif k == "layers":
        out += [words.filter(lambda w: w != "all"), st.just([]), st.integers(),
                words.map(lambda w: ["net.layers.1", f"net.{w}.9"])]
    elif k == "target":
        out += [st.integers(max_value=-1), st.integers(min_value=NUM_CLASSES, max_value=10**9),
                words.filter(lambda w: w not in ("random", "least_likely", "all")), st.booleans()]
    elif k == "list":
        out += [st.integers(), words]
    return st.one_of(*out) if out else st.nothing()


def grid_params(name: str) -> dict[str, Param]:
    """The parameters a grid may set per attack: every declared one but the grid-level keys."""
    return {k: p for k, p in ATTACKS.get(name).declared().items()
            if k not in GRID_LEVEL and p.kind != "any"}


#: the harness's own attacks (a library attack adapted on first use, ``torchattack:<Name>``, takes
#: the library's parameters, judged by the adapter: tests/test_ecosystem.py)
NATIVE = [a for a in ATTACKS.names() if ":" not in a]
CASES = [(a, k) for a in NATIVE for k in grid_params(a)]


class Reached(AssertionError):
    """A bad value got past the preflight."""


@pytest.fixture
def spies(monkeypatch):
    """Trainer, crafting and run store that fail the test if a case ever reaches them."""
    from advtransfer.run import cell, runner, store
    from advtransfer.models import zoo

    def stop(what):
        def f(*_a, **_k):
            raise Reached(f"a bad value reached {what}")
        return f

    monkeypatch.setattr(zoo, "ensure_trained", stop("training"))
    monkeypatch.setattr(runner.zoo, "ensure_trained", stop("training"))
    monkeypatch.setattr(cell, "craft", stop("crafting"))
    monkeypatch.setattr(store.RunStore, "__init__", stop("the run store"))


def run_grid(tmp: Path, attack: str, params: dict) -> tuple[int, str, list[Path]]:
    """(exit code, stderr, files written under ``tmp``) of ``advtransfer grid`` in-process."""
    from advtransfer.cli import main

    d = tmp / f"case{len(list(tmp.iterdir()))}"
    d.mkdir()
    g = d / "grid.yaml"
    g.write_text(yaml.safe_dump({**BASE_GRID, "attacks": {attack: params}}, sort_keys=False))
    before = set(d.rglob("*"))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["grid", str(g), "--out", str(d / "run"), "--no-progress"])
    return rc, err.getvalue(), sorted(set(d.rglob("*")) - before)


def assert_refused(rc: int, err: str, written: list[Path], key: str, value) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, f"{key}={value!r}: exit {rc}\n{err}"
    assert len(lines) == 1 and lines[0].startswith("advtransfer: error:"), f"{key}={value!r}: {err}"
    assert key in lines[0], f"{key}={value!r}: the message should name the parameter: {lines[0]}"
    assert written == [], f"{key}={value!r}: wrote {written}"


@pytest.mark.parametrize("attack", NATIVE)
def test_each_attacks_valid_base_passes_the_preflight(attack, tmp_path, spies):
    """The starting point of every case is valid: with nothing wrong, the run gets as far as
    opening the run store before training the untrained ci zoo (the spies), so any refusal below
    is the drawn value's."""
    with pytest.raises(Reached):
        run_grid(tmp_path, attack, VALID_BASE.get(attack, {}))


@pytest.mark.parametrize("attack,key", CASES, ids=[f"{a}.{k}" for a, k in CASES])
def test_every_declared_parameter_refuses_what_it_excludes(attack, key, tmp_path, spies):
    """Every (attack, parameter): two values its declaration excludes (drawn deterministically),
    each refused in one line; the random test below draws further ones."""
    p = grid_params(attack)[key]

    @settings(max_examples=2, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(invalid_values(p))
    def case(value):
        rc, err, written = run_grid(tmp_path, attack, {**VALID_BASE.get(attack, {}), key: value})
        assert_refused(rc, err, written, key, value)

    case()


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_attack_parameter_and_value(data, tmp_path_factory):
    """Random (attack, parameter, invalid value) triples beyond the fixed four per parameter."""
    import pytest as _pytest

    attack, key = data.draw(st.sampled_from(CASES), label="case")
    value = data.draw(invalid_values(grid_params(attack)[key]), label="value")
    with _pytest.MonkeyPatch.context() as mp:
        from advtransfer.run import cell, runner, store

        def stop(*_a, **_k):
            raise Reached("a bad value got past the preflight")

        mp.setattr(runner.zoo, "ensure_trained", stop)
        mp.setattr(cell, "craft", stop)
        mp.setattr(store.RunStore, "__init__", stop)
        rc, err, written = run_grid(tmp_path_factory.mktemp("fuzz"), attack, {**VALID_BASE.get(attack, {}), key: value})
    assert_refused(rc, err, written, key, value)


@pytest.mark.parametrize("attack", NATIVE)
def test_eps_and_seed_from_python(attack):
    """The grid-level parameters, drawn for the Python API: non-positive or non-numeric ε and
    non-integer seeds are one UserError naming them."""
    for key, bad in [("eps", 0), ("eps", "-8/255"), ("eps", "eight"), ("eps", float("nan")), ("seed", 1.5),
                     ("seed", "zero"), ("seed", True)]:
        with pytest.raises(UserError, match=key):
            create_attack(attack, **{**VALID_BASE.get(attack, {}), key: bad})


def test_declarations_are_complete():
    """Every attack declares every parameter it takes, with a kind the strategies know, and its
    declared defaults are what it runs with."""
    for name in NATIVE:
        cls = ATTACKS.get(name)
        assert set(cls.extra_defaults) == set(cls.parameters), name
        a = create_attack(name, **VALID_BASE.get(name, {}))
        assert set(a.extra) == set(cls.parameters), name
        for k, p in cls.parameters.items():
            assert p.kind != "any", f"{name}.{k} has no declared type"
            assert p.doc, f"{name}.{k} has no doc line"
            if p.default is not None:
                p.check(name, k, p.default)  # the default is valid by its own declaration
