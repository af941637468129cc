"""The seeds' headline claims as one table, recomputed from run folders.

A claims file (``claims/cifar10.yaml``) lists claims; each names the grid whose run measures it and
one paired comparison in that run:

- ``by: attack``: attack ``a`` against ``b`` on the same surrogate rows, where ``b`` is an attack
  label or ``matched:step`` / ``matched:evals`` (the grid's MI-FGSM baseline matched to ``a`` in
  steps, or in gradient evaluations per image); ``a: matched:...`` claims the baseline beats ``b``;
- ``by: surrogate``: surrogate ``a`` against surrogate ``b`` (``surrogate_base`` names) under one
  attack label; replicate k of one is paired with replicate k of the other;
- ``by: victim``: victim ``a`` resists the same adversarial images better than victim ``b`` (the
  difference is ASR on ``b`` − ASR on ``a``), under one attack label (or every attack of the run);
  victim replicates ``a@rk`` and ``b@rk`` are paired;
- ``by: lineage``: the adversarial images of a surrogate replicate fool its *own* descendant (victim
  ``a@rk`` for surrogate replicate k: the model fine-tuned or adapted from that very source) more
  than the same recipe descended from another source replicate (``a@rj``, j ≠ k), under one attack
  label: the AdaptGuard question, whether a perturbation survives through the inherited weights
  rather than through the recipe. ``b`` is not given (it is ``a`` of the other lineages). Pairs are
  (cell, image) with both descendants right on the clean image;
- ``by: whitebox``: an attack against a baseline at equal white-box success rather than at equal
  ε. One side is ``ladder:<label>``: that baseline runs at a ladder of radii in the run of the
  claim's ``ladder`` grid (same surrogates, images and victims, each surrogate also a victim); the
  other side is the attack's label in the claim's grid. For each surrogate and held-out victim the
  baseline's transfer is read off the ladder at the white-box ASR the attack reached
  (:mod:`~advtransfer.analysis.measures.whitebox_match`). The difference (A − B) is the mean over
  (surrogate, victim) pairs; its interval is the percentile bootstrap over images with the matching
  redone in every resample, and its p is the bootstrap's two-sided tail (twice the smaller share
  of resampled differences on either side of 0, at least 1/2000).

A claim's ``sizes: {<size>: {...}}`` replaces its ``grid``, ``ladder``, ``a``, ``b``, ``attack``,
``surrogates`` or ``victims`` at one zoo size (a size that trains differently has its own grid, or keeps a
checkpoint at another epoch); ``skip: <why>`` there leaves the claim unmeasured at that size and
the table says why.

For one zoo size the claim's run is ``RUNS/<size>/<grid name>/`` (``advtransfer grid GRID --size
SIZE --out ...``). Pairs are (victim, replicate, image) triples whose image the victim classifies
correctly in both rows, over the held-out victims at the claim's ε: neither one of the
surrogate's models nor another replicate of one (``resnet20_a@r1`` is not held out from a surrogate
``resnet20_a``, so every replicate of a surrogate meets the same held-out victims). The difference
(A − B, in ASR points) is pooled over (victim, replicate) strata with the exact stratified test of
:func:`~advtransfer.analysis.stats.compare_paired`; its 95% interval is a percentile bootstrap
that resamples images, so each image's outcomes on all victims and replicates stay together (the
victims see the same images, so they are not independent). Holm's adjustment runs over the claims
of one size. The replicate range is the smallest and largest
pooled difference of one replicate alone.

Verdict of a claim "A is better than B" at one size:

- **holds**: Holm-adjusted p < 0.05, the difference is positive, and every replicate's difference
  is positive;
- **does not hold**: Holm-adjusted p < 0.05 with a negative difference, or the interval's upper
  end below the claim's ``min_gain`` (default 1 point: no gain as large as that is left);
- **cannot tell**: otherwise (the interval, or the replicates, straddle the line).

Regimes. The file's ``regimes:`` names attack regimes, each a set of grid keys changed before the
grid is read (``set:``, as ``advtransfer grid --set`` takes them: ``{eps: [16/255]}``,
``{defaults: {steps: 50}}``), a ``label`` saying what it is, optionally the zoo ``sizes`` it is
measured at and the ``attacks`` it runs (``--attack``: a regime of one attack's paper); ``standard`` (the grids as written) always exists. A claim lists the regimes it is
measured in (``regimes: [eps16, steps50]`` or a mapping to the claim keys that differ there, e.g.
the attack label of a transposed kernel) and may name its ``paper_regime`` with its
``paper_source``. A claim's run at a regime other than ``standard`` is
``RUNS/<size>/<grid name>@<regime>/``; a regime that sets one ε sets the claim's. The table has one
row per (claim, regime), Holm's adjustment runs over all rows of a size, and each claim gets one
label per size from its measured regimes (:func:`regime_label`): holds in every regime tested,
regime-dependent (holds in some, not in others), or holds in none. Where the per-image records
have the ``hit`` column (the goal met on x_adv whatever the victim said on x), every row also
gives the difference over *all* images (``all_*`` columns: 1 − victim accuracy, the denominator
most papers report) beside the clean-correct one the verdict uses.

Nothing here crafts or trains: every number comes from ``results.parquet`` and ``samples/``.
"""
from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ...core.config import SIZES
from ...core.errors import UserError
from ...core.utils import parse_fraction
from ..runs import read_results
from ..stats import compare_paired, holm
from .compare import Samples, paired_hits, paired_outcomes

ALPHA = 0.05
BY = ("attack", "surrogate", "victim", "lineage", "whitebox")
_KEYS = ("claim", "paper", "setting", "grid", "by", "a", "b", "attack", "eps", "surrogates", "victims",
         "paper_number", "min_gain", "id", "sizes", "ladder", "regimes", "paper_regime", "paper_source")
#: the regime every claim is measured in: the grids as their files say
STANDARD = "standard"
#: what a claim's ``regimes: {<regime>: {...}}`` may replace in that regime (an attack label of a
#: transposed setting, another ε, a note why it is not measured there)
REGIME_KEYS = ("a", "b", "attack", "surrogates", "victims", "eps", "skip", "ladder_regime")
_REGIME_FILE_KEYS = ("label", "set", "sizes", "source", "attacks")
#: what a claim's ``sizes: {<size>: {...}}`` may replace at one zoo size (the grid and the models
#: differ where a size trains differently: a converged grid, a checkpoint at another epoch)
SIZE_KEYS = ("grid", "a", "b", "attack", "surrogates", "victims", "skip", "ladder")


@dataclass(frozen=True)
class Claim:
    """One claim: "``a`` transfers better than ``b``" in the run of ``grid``."""

    id: str
    claim: str
    paper: str
    setting: str
    grid: str
    by: str
    a: str
    b: str
    eps: float
    eps_str: str
    attack: str | None = None
    surrogates: tuple[str, ...] | None = None
    victims: tuple[str, ...] | None = None
    paper_number: str | None = None
    min_gain: float = 0.01
    sizes: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    skip: str | None = None  # why the claim is not measured at a size (``sizes.<size>.skip``)
    ladder: str | None = None  # ``by: whitebox``: the grid running ``b`` at a ladder of radii
    regime: str = STANDARD  # the regime this claim is measured in (:meth:`at`)
    #: (regime, the claim's values there) for each regime the claim is measured in, standard first
    regimes: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ((STANDARD, ()),)
    paper_regime: str | None = None  # the regime closest to the paper's own (claims/regimes.md)
    paper_source: str | None = None  # where the paper regime's values come from
    #: ``by: whitebox``: the regime whose run of the ladder grid a regime reads (None: the claim's
    #: own). A regime that changes ε reads the ladder as run in the standard regime, whose radii
    #: bracket the attack's white-box level, at the same steps.
    ladder_regime: str | None = None

    def grids(self) -> tuple[str, ...]:
        """The grids whose runs this claim reads: its own, then its ladder's."""
        return (self.grid,) + ((self.ladder,) if self.ladder else ())

    def grid_runs(self) -> tuple[tuple[str, str], ...]:
        """(grid, regime) of each run this claim reads: its grid in its regime, then its ladder's
        grid in ``ladder_regime`` (else its regime)."""
        return ((self.grid, self.regime),) + (((self.ladder, self.ladder_regime or self.regime),) if self.ladder else ())

    def regime_names(self) -> tuple[str, ...]:
        return tuple(r for r, _ in self.regimes)

    def at(self, size: str, regime: str = STANDARD) -> "Claim":
        """The claim as measured at zoo ``size`` in ``regime``: its ``sizes.<size>`` values, then the
        regime's, applied (a regime the claim does not list is a :class:`KeyError`)."""
        over = dict(dict(self.sizes).get(size, ()))
        reg = dict(dict(self.regimes)[regime])
        if "skip" in over:  # not measured at this size in any regime: the size's reason stands
            reg.pop("skip", None)
        over.update(reg)
        if "eps" in over:
            over["eps_str"] = str(over["eps"])
            over["eps"] = parse_fraction(over["eps"], "eps")
        return replace(self, **over, sizes=(), regime=regime)

    def run_name(self, grid: str, regime: str | None = None) -> str:
        """The run folder name of ``grid`` (a grid file's name) in ``regime`` (default: this claim's)."""
        regime = self.regime if regime is None else regime
        return grid if regime == STANDARD else f"{grid}@{regime}"


@dataclass(frozen=True)
class Regime:
    """An attack regime: grid keys changed before the grid is read (``sets``), what it is
    (``label``), the zoo sizes it is measured at (None: every size) and where its values come from."""

    name: str
    label: str
    sets: dict = field(default_factory=dict)
    sizes: tuple[str, ...] | None = None
    source: str = ""
    attacks: tuple[str, ...] = ()  # run only these attack labels (and their matched baselines); () = all
    #: (grid, labels) where the regime runs other labels in a grid than ``attacks`` (``attacks:`` given
    #: as a mapping grid → labels: a grid it does not name runs every attack)
    grid_attacks: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def labels(self, grid: str | None = None) -> tuple[str, ...]:
        """The attack labels the regime runs in ``grid`` (a claim's ``grid:``); () = all of them."""
        return dict(self.grid_attacks).get(grid, self.attacks) if grid is not None else self.attacks

    def grid_args(self, grid: str | None = None) -> list[str]:
        """The regime as ``advtransfer grid`` arguments for ``grid``: ``-n N`` for its image count (so it
        wins over a runner's default ``-n``), ``--attack`` for the labels it runs there, ``--set
        KEY.PATH=VALUE`` for every other key."""
        from ...grid.load import flatten_sets

        rest = {k: v for k, v in self.sets.items() if k != "n"}
        only = self.labels(grid)
        return ((["-n", str(self.sets["n"])] if "n" in self.sets else [])
                + (["--attack", ",".join(only)] if only else [])
                + [a for kv in flatten_sets(rest) for a in ("--set", kv)])


@dataclass(frozen=True)
class ClaimsSpec:
    """A claims file: its name, the zoo sizes compared side by side, and the claims."""

    name: str
    sizes: tuple[str, ...]
    claims: tuple[Claim, ...] = field(default_factory=tuple)
    regimes: dict[str, Regime] = field(default_factory=lambda: {STANDARD: Regime(STANDARD, "the grids as written")})

    def measured(self, size: str) -> list[Claim]:
        """Every (claim, regime) as measured at zoo ``size``, claims in file order, each claim's
        regimes in its order; a regime not measured at ``size`` gets a ``skip`` saying so."""
        out = []
        for c in self.claims:
            for r in c.regime_names():
                m = c.at(size, r)
                reg = self.regimes[r]
                if not m.skip and reg.sizes is not None and size not in reg.sizes:
                    m = replace(m, skip=f"regime {r} is measured at the {' and '.join(reg.sizes)} zoo only")
                out.append(m)
        return out

    def grid_names(self, size: str | None = None) -> list[str]:
        """The grids whose runs the table reads (at one zoo ``size``, or at any), in first-use order."""
        sizes = [size] if size else list(self.sizes)
        return list(dict.fromkeys(g for s in sizes for c in self.measured(s) if not c.skip for g in c.grids()))

    def runs(self, size: str) -> list[tuple[str, str]]:
        """The (grid, regime) runs the table reads at zoo ``size``, in first-use order."""
        return list(dict.fromkeys(gr for c in self.measured(size) if not c.skip for gr in c.grid_runs()))


def load_claims(path: str | Path) -> ClaimsSpec:
    """Parse and check a claims file (``yaml.safe_load``); a bad entry is one :class:`UserError`
    line naming the claim and the key."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise UserError(f"claims file {str(path)!r} does not exist; pass e.g. claims/cifar10.yaml")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise UserError(f"{p}: not valid YAML ({str(e).splitlines()[0]}); fix the file") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("claims"), list) or not raw["claims"]:
        raise UserError(f"{p}: needs a mapping with a non-empty `claims:` list")
    sizes = raw.get("sizes", ["converged", "cpu"])
    if not isinstance(sizes, list) or not sizes or not all(isinstance(s, str) for s in sizes):
        raise UserError(f"{p}: `sizes` must be a list of zoo sizes, e.g. [converged, cpu]")
    for s in sizes:
        if s not in SIZES:
            raise UserError(f"{p}: unknown zoo size {s!r}; sizes: {', '.join(SIZES)}")
    regimes = _load_regimes(raw.get("regimes"), p, sizes)
    claims: list[Claim] = []
    for k, e in enumerate(raw["claims"]):
        if not isinstance(e, dict):
            raise UserError(f"{p}: claim {k + 1} must be a mapping")
        cid = str(e.get("id", "")).strip()
        where = f"{p}: claim {cid or k + 1}"
        if cid and cid in {c.id for c in claims}:
            raise UserError(f"{where}: the id is used twice")
        claims.append(_parse_claim(e, cid, where, sizes, regimes))
    for reg in regimes.values():  # a grid named in a regime's attacks mapping is one its claims run
        grids = {c.at(s, reg.name).grid for c in claims if reg.name in c.regime_names() for s in sizes}
        for g, _ in reg.grid_attacks:
            if g not in grids:
                raise UserError(f"{p}: regime {reg.name!r}: attacks names grid {g!r}, which no claim measures in "
                                f"this regime; its claims' grids: {', '.join(sorted(grids)) or 'none'}")
    return ClaimsSpec(name=str(raw.get("name", p.stem)), sizes=tuple(sizes), claims=tuple(claims), regimes=regimes)


def _parse_claim(e: dict, cid: str, where: str, sizes: list[str], regimes: dict[str, Regime]) -> Claim:
    """One entry of the file's ``claims:`` list, checked; ``where`` names it in the error line."""
    unknown = sorted(set(e) - set(_KEYS))
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; keys: {', '.join(_KEYS)}")
    for key in ("id", "claim", "paper", "grid", "by", "a", "eps"):
        if not e.get(key):
            raise UserError(f"{where}: `{key}` is required")
    if e["by"] not in BY:
        raise UserError(f"{where}: `by` must be {', '.join(BY[:-1])} or {BY[-1]}, got {e['by']!r}")
    if (e["by"] == "lineage") == bool(e.get("b")):
        raise UserError(f"{where}: " + ("a lineage claim compares victim `a`'s own lineage with its other lineages; "
                                        "leave `b` out" if e.get("b") else "`b` is required"))
    if e["by"] == "lineage" and not e.get("attack"):
        raise UserError(f"{where}: a lineage claim names the attack label it compares under (`attack:`)")
    if (e["by"] == "whitebox") != bool(e.get("ladder")):
        raise UserError(f"{where}: " + ("a whitebox claim names the grid of its baseline's ladder of radii "
                                        "(`ladder:`, e.g. repr-vs-data)" if e["by"] == "whitebox" else
                                        "`ladder:` belongs to a `by: whitebox` claim only"))
    if e["by"] == "whitebox" and [str(e[k]).startswith("ladder:") for k in ("a", "b")].count(True) != 1:
        raise UserError(f"{where}: in a whitebox claim one side is the ladder's baseline, `ladder:<label>` "
                        "(e.g. a: ladder:mifgsm, b: repr_push), the other an attack label")
    if e["by"] == "surrogate" and not e.get("attack"):
        raise UserError(f"{where}: a surrogate claim names the attack label it compares under (`attack:`)")
    try:
        eps = parse_fraction(e["eps"], "eps")
    except (UserError, ValueError):
        raise UserError(f"{where}: eps must be a fraction like 8/255, got {e['eps']!r}") from None
    gain = e.get("min_gain", 0.01)
    if not isinstance(gain, (int, float)) or not 0 <= gain < 1:
        raise UserError(f"{where}: min_gain is a rate in [0, 1), e.g. 0.01 for one point; got {gain!r}")
    tup = lambda v: None if v is None else tuple(str(x) for x in (v if isinstance(v, list) else [v]))  # noqa: E731
    by_size = e.get("sizes") or {}
    if not isinstance(by_size, dict) or not all(isinstance(v, dict) for v in by_size.values()):
        raise UserError(f"{where}: sizes must map a zoo size to the keys that differ there, like "
                        "{converged: {grid: surrogate-training-converged}}")
    sized = []
    for size, over in by_size.items():
        if size not in sizes:
            raise UserError(f"{where}: sizes names {size!r}, not one of the file's sizes ({', '.join(sizes)})")
        bad = sorted(set(over) - set(SIZE_KEYS))
        if bad:
            raise UserError(f"{where}: sizes.{size} may only set {', '.join(SIZE_KEYS)}, not {', '.join(bad)}")
        over = {k: (tup(v) if k in ("surrogates", "victims") else str(v)) for k, v in over.items()}
        sized.append((str(size), tuple(over.items())))
    claim_regimes = _claim_regimes(e.get("regimes"), regimes, where)
    paper_regime = e.get("paper_regime")
    if paper_regime is not None and paper_regime not in dict(claim_regimes):
        raise UserError(f"{where}: paper_regime {paper_regime!r} is not one of the claim's regimes "
                        f"({', '.join(r for r, _ in claim_regimes)}); list it under `regimes:`")
    return Claim(id=cid, claim=str(e["claim"]), paper=str(e["paper"]), setting=str(e.get("setting", "")),
                 grid=str(e["grid"]), by=e["by"], a=str(e["a"]),
                 b=str(e["a"]) + " (other lineages)" if e["by"] == "lineage" else str(e["b"]), eps=eps,
                 eps_str=str(e["eps"]), attack=e.get("attack"), surrogates=tup(e.get("surrogates")),
                 victims=tup(e.get("victims")), paper_number=e.get("paper_number"),
                 min_gain=float(gain), sizes=tuple(sized),
                 ladder=str(e["ladder"]) if e.get("ladder") else None, regimes=claim_regimes,
                 paper_regime=paper_regime, paper_source=e.get("paper_source"))


def _load_regimes(raw: Any, p: Path, sizes: list[str]) -> dict[str, Regime]:
    """The file's ``regimes:`` (name → {label, set, sizes, source}), ``standard`` first."""
    out = {STANDARD: Regime(STANDARD, "the grids as written")}
    if raw is None:
        return out
    if not isinstance(raw, dict):
        raise UserError(f"{p}: regimes must map a regime name to {{label: ..., set: {{eps: [16/255]}}}}")
    for name, r in raw.items():
        where = f"{p}: regime {name!r}"
        if not isinstance(r, dict):
            raise UserError(f"{where} must be a mapping like {{label: ..., set: {{eps: [16/255]}}}}")
        bad = sorted(set(r) - set(_REGIME_FILE_KEYS))
        if bad:
            raise UserError(f"{where}: unknown key(s) {', '.join(bad)}; keys: {', '.join(_REGIME_FILE_KEYS)}")
        if not str(name) or "@" in str(name) or "/" in str(name) or " " in str(name):
            raise UserError(f"{where}: a regime name is one word without @, / or spaces (it names run folders)")
        sets = r.get("set") or {}
        if not isinstance(sets, dict) or (name == STANDARD and sets):
            raise UserError(f"{where}: set must map grid keys to their values in this regime, e.g. {{eps: [16/255]}}"
                            + ("; the standard regime changes nothing" if name == STANDARD else ""))
        rs = r.get("sizes")
        if rs is not None and (not isinstance(rs, list) or not set(rs) <= set(sizes)):
            raise UserError(f"{where}: sizes must list zoo sizes of the file ({', '.join(sizes)}), got {rs!r}")
        if not r.get("label"):
            raise UserError(f"{where}: `label` is required (what the regime is: eps, steps, step size, targeting)")
        only = r.get("attacks") or []
        by_grid = only if isinstance(only, dict) else {}
        labels_ok = lambda v: isinstance(v, list) and bool(v) and all(isinstance(a, str) and a for a in v)  # noqa: E731
        if not (isinstance(only, list) and (not only or labels_ok(only))) and not (
                by_grid and all(isinstance(g, str) and labels_ok(v) for g, v in by_grid.items())):
            raise UserError(f"{where}: attacks must list the attack labels the regime runs, e.g. [sgm], or map "
                            "grids to their labels, e.g. {ensemble: [cwa], cwa-beta: [cwa_b50]}")
        out[str(name)] = Regime(str(name), str(r["label"]), sets, tuple(rs) if rs is not None else None,
                                str(r.get("source", "")), () if by_grid else tuple(only),
                                tuple((g, tuple(v)) for g, v in by_grid.items()))
    return out


def _claim_regimes(raw: Any, regimes: dict[str, Regime], where: str) -> tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]:
    """A claim's ``regimes:`` (a list of names, or a mapping name → the claim keys that differ
    there) as (name, items) pairs, ``standard`` first; a regime that sets one ε sets the claim's."""
    if raw is None:
        raw = {}
    if isinstance(raw, list):
        raw = {r: {} for r in raw}
    if not isinstance(raw, dict) or not all(v is None or isinstance(v, dict) for v in raw.values()):
        raise UserError(f"{where}: regimes must be a list of regime names or map a name to the claim keys that "
                        f"differ there, like {{eps16: {{}}, paper: {{a: tifgsm_k3}}}}")
    out = []
    for name in [STANDARD, *(r for r in raw if r != STANDARD)]:
        if name not in regimes:
            from ...core.registry import suggest

            raise UserError(f"{where}: " + suggest(str(name), sorted(regimes), "regime") + " (define it under the file's regimes:)")
        over = dict(raw.get(name) or {})
        bad = sorted(set(over) - set(REGIME_KEYS))
        if bad:
            raise UserError(f"{where}: regimes.{name} may only set {', '.join(REGIME_KEYS)}, not {', '.join(bad)}")
        lr = over.get("ladder_regime")
        if lr is not None and lr not in regimes:
            raise UserError(f"{where}: regimes.{name}.ladder_regime {lr!r} is not a regime of the file; regimes: "
                            f"{', '.join(regimes)}")
        eps = regimes[name].sets.get("eps")
        if "eps" not in over and eps is not None:
            eps = eps if isinstance(eps, list) else [eps]
            if len(eps) != 1:
                raise UserError(f"{where}: regime {name!r} sets {len(eps)} radii; give the claim's eps under "
                                f"regimes: {{{name}: {{eps: ...}}}}")
            over["eps"] = eps[0]
        if "eps" in over:
            try:
                parse_fraction(over["eps"], "eps")
            except (UserError, ValueError):
                raise UserError(f"{where}: regimes.{name}.eps must be a fraction like 16/255, got {over['eps']!r}") from None
            over["eps"] = str(over["eps"])
        tup = lambda v: tuple(str(x) for x in (v if isinstance(v, list) else [v]))  # noqa: E731
        over = {k: (tup(v) if k in ("surrogates", "victims") else str(v)) for k, v in over.items()}
        out.append((name, tuple(sorted(over.items()))))
    return tuple(out)


def _at_eps(df: pd.DataFrame, eps: float) -> pd.DataFrame:
    return df[np.isclose(df["eps"].astype(float), eps, rtol=0, atol=1e-9)]


def _victim_base(name: str) -> tuple[str, int]:
    base, _, rep = str(name).partition("@r")
    return base, int(rep) if rep.isdigit() else 0


def surrogate_model_bases(surrogate: str, params: str = "") -> set[str]:
    """The models of a surrogate set without replicate suffixes: from its label (``a+b``, ``a@r1``)
    and from the model names keying its ``surrogate_params`` JSON (a named set such as ``ens3``)."""
    import json

    names = set(str(surrogate).split("+"))
    try:
        p = json.loads(params) if params else {}
    except ValueError:
        p = {}
    if isinstance(p, dict) and p and all(isinstance(v, dict) for v in p.values()):
        names |= set(p)
    return {_victim_base(n)[0] for n in names}


def held_out(df: pd.DataFrame) -> pd.DataFrame:
    """The rows whose victim is held out from the surrogate: not one of its models and not another
    replicate of one (the sibling ``resnet20_a@r1`` of a surrogate ``resnet20_a`` is the same recipe
    at another seed, so every replicate of a surrogate keeps the same held-out victims)."""
    df = df[~df["is_whitebox"].astype(bool)]
    if df.empty:
        return df
    params = df["surrogate_params"] if "surrogate_params" in df else pd.Series("", index=df.index)
    bases = {k: surrogate_model_bases(*k) for k in set(zip(df["surrogate"], params.fillna("")))}
    keep = [_victim_base(v)[0] not in bases[(s, p)] for v, s, p in zip(df["victim"], df["surrogate"], params.fillna(""))]
    return df[np.asarray(keep, dtype=bool)]


def claim_rows(df: pd.DataFrame, claim: Claim) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """The A rows and the B rows of ``claim`` in one run's results (held-out victims only, see
    :func:`held_out`) and the columns that pair them."""
    df = held_out(_at_eps(df, claim.eps))
    if claim.by in ("victim", "lineage"):
        df = df[df["attack_label"] == claim.attack] if claim.attack else df
        parts = df["victim"].map(_victim_base)
        df = df.assign(victim_base=[p[0] for p in parts], victim_rep=[p[1] for p in parts])
        if claim.by == "lineage":  # own descendant (its replicate is the surrogate's) vs the others
            df = df[df["victim_base"] == claim.a]
            own = df["victim_rep"].to_numpy() == df["replicate"].astype(int).to_numpy()
            return df[own], df[~own], ["cell_id"]
        a, b = df[df["victim_base"] == claim.a], df[df["victim_base"] == claim.b]
        return a, b, ["cell_id", "victim_rep"]
    if claim.victims is not None:
        df = df[df["victim"].isin(claim.victims)]
    if claim.by == "attack":
        if claim.surrogates is not None:
            df = df[df["surrogate_base"].isin(claim.surrogates)]
        keys = ["victim", "replicate", "seed", "surrogate_base"]
        if claim.a.startswith("matched:"):  # "the baseline beats b": the same pairs, sides swapped
            b, a, _ = claim_rows(df, replace(claim, a=claim.b, b=claim.a, victims=None, surrogates=None))
            return a, b, keys
        a = df[(df["attack_label"] == claim.a) & (df["baseline_for"] == "")]
        if claim.b.startswith("matched:"):
            match = claim.b.split(":", 1)[1]
            fors = df["baseline_for"].str.split(",")
            b = df[(df["match"] == match) & fors.apply(lambda f: claim.a in f)]
        else:
            b = df[df["attack_label"] == claim.b]
        return a, b, keys
    df = df[df["attack_label"] == claim.attack]
    a, b = df[df["surrogate_base"] == claim.a], df[df["surrogate_base"] == claim.b]
    return a, b, ["victim", "replicate", "seed"]


def whitebox_sides(claim: Claim) -> tuple[str, str, int]:
    """(attack label, ladder baseline label, sign) of a ``by: whitebox`` claim; sign +1 when ``a``
    is the attack (A − B = attack − matched baseline), −1 when ``a`` is the ladder."""
    if claim.a.startswith("ladder:"):
        return claim.b, claim.a.split(":", 1)[1], -1
    return claim.a, claim.b.split(":", 1)[1], 1


def whitebox_cells(df: pd.DataFrame, claim: Claim, ladder: bool) -> set[str]:
    """Cell ids a ``by: whitebox`` claim reads in one run: the attack's cells at the claim's ε (every
    victim, white-box rows included) in its grid's run, or with ``ladder`` the baseline's cells at
    every radius in the ladder's run; single-model surrogates only."""
    attack, base, _ = whitebox_sides(claim)
    df = df[(df["match"] == "none") & (df["n_surrogates"] == 1)]
    if claim.surrogates is not None:
        df = df[df["surrogate"].isin(claim.surrogates)]
    if ladder:
        return set(df.loc[df["attack_label"] == base, "cell_id"])
    return set(_at_eps(df[df["attack_label"] == attack], claim.eps)["cell_id"])


def evaluate_whitebox_claim(claim: Claim, run_dir: str | Path, ladder_dir: str | Path,
                            seed: int = 0) -> dict[str, Any]:
    """``by: whitebox``: the attack in ``run_dir`` against the baseline's ladder in ``ladder_dir``,
    matched at the attack's white-box ASR, pooled over (surrogate, held-out victim) pairs (rates in
    [0, 1]; A − B with the sides as the claim writes them; see the module docstring). One-line
    :class:`UserError` when a run lacks the rows."""
    from .whitebox_match import bootstrap_interval, matched_pairs

    attack, base, sign = whitebox_sides(claim)
    pairs = matched_pairs(run_dir, ladder_dir, [attack], base, seed, eps=claim.eps,
                          surrogates=claim.surrogates, victims=claim.victims)
    # a surrogate whose white-box level lies outside its ladder (or too near an end of it to match
    # in 90% of the resamples) has no equal-success baseline: it is left out, and the row says so
    dropped = sorted({p.surrogate for p in pairs if not np.isfinite(p.asr_matched)
                      or np.isfinite(p.boot_diff).mean() < 0.9})
    pairs = [p for p in pairs if p.surrogate not in dropped and np.isfinite(p.asr_attack)]
    if not pairs:
        raise UserError(f"claim {claim.id!r}: no surrogate of {run_dir} has a white-box level of {attack!r} "
                        f"inside the {base!r} ladder of {ladder_dir} with its held-out victims; run the ladder "
                        f"grid ({claim.ladder}) on the same surrogates, images and victims")
    D = sign * np.mean(np.stack([p.boot_diff for p in pairs]), 0)
    lo, hi = bootstrap_interval(D)  # NaN when the kept surrogates' unmatched resamples fall on different draws
    p_boot = float("nan")
    if np.isfinite(lo):
        d = D[np.isfinite(D)]
        p_boot = float(min(1.0, max(2 * min(np.mean(d <= 0), np.mean(d >= 0)), 1.0 / len(D))))  # len(D) = N_BOOT resamples
    diff = sign * float(np.mean([p.diff for p in pairs]))
    # the replicate range as in evaluate_claim: the difference over replicate k's pairs alone
    # (replicate 0 also holds the surrogates trained once)
    by_rep: dict[int, list[float]] = {}
    for p in pairs:
        by_rep.setdefault(_victim_base(p.surrogate)[1], []).append(p.diff)
    per_rep = [sign * float(np.mean(v)) for v in by_rep.values()]
    asr_atk, asr_base = float(np.mean([p.asr_attack for p in pairs])), float(np.mean([p.asr_matched for p in pairs]))
    ge_atk = float(np.mean([p.grad_evals_attack for p in pairs]))
    ge_base = float(np.mean([p.grad_evals_matched for p in pairs]))
    return {
        "n_pairs": int(sum(p.n_images for p in pairs)), "asr_a": asr_atk if sign > 0 else asr_base,
        "asr_b": asr_base if sign > 0 else asr_atk, "diff": diff, "ci_low": lo, "ci_high": hi,
        "p": p_boot, "n_victims": len({p.victim for p in pairs}),
        "n_replicates": len(per_rep), "rep_min": min(per_rep), "rep_max": max(per_rep),
        "n_surrogates": len({p.surrogate for p in pairs}),
        "whitebox_attack": float(np.mean([p.whitebox_attack for p in pairs])),
        "eps_matched": float(np.mean([p.eps_matched for p in pairs])),
        "grad_evals_a": ge_atk if sign > 0 else ge_base, "grad_evals_b": ge_base if sign > 0 else ge_atk,
        "ladder_side": "b" if sign > 0 else "a", "surrogates_unmatched": ", ".join(dropped),
    }


def check_lineage(own: pd.DataFrame, what: str) -> None:
    """``by: lineage`` pairs surrogate replicate k with victim replicate k by name; where the
    catalogue declares the victim, check that it really continues from that surrogate's weights
    (``init_from``, :func:`~advtransfer.analysis.measures.mismatch.relation`), else one line."""
    from ...models.catalogue import load_specs, split_replicate
    from .mismatch import relation

    specs = load_specs()
    size = own["zoo_size"] if "zoo_size" in own else pd.Series("cpu", index=own.index)
    for sur, vic, sz in set(zip(own["surrogate"], own["victim"], size)):
        if split_replicate(vic)[0] in specs and relation(sur, vic, specs, str(sz)) != "descendant":
            raise UserError(f"{what}: victim {vic!r} does not continue from surrogate {sur!r} in the catalogue "
                            "(init_from); a lineage claim pairs each source replicate with its own descendant")


def evaluate_claim(claim: Claim, run_dir: str | Path, seed: int = 0) -> dict[str, Any]:
    """The pooled paired comparison of ``claim`` in one run folder (rates in [0, 1]); raises a
    one-line :class:`UserError` when the run lacks the rows the claim needs."""
    df = read_results(run_dir)
    a, b, keys = claim_rows(df, claim)
    what = f"claim {claim.id!r}: {run_dir}"
    if claim.by == "lineage" and not a.empty:
        check_lineage(a, what)
    if a.empty or b.empty:
        side = claim.a if a.empty else claim.b
        raise UserError(f"{what} has no held-out rows of {side!r} at eps {claim.eps_str}; "
                        f"run the claim's grid ({claim.grid}) into this folder")
    m = a.merge(b, on=keys, suffixes=("_a", "_b"))
    if m.empty:
        raise UserError(f"{what}: rows of {claim.a!r} and {claim.b!r} share no ({', '.join(keys)})")
    by_victim = claim.by == "victim"
    two_victims = claim.by in ("victim", "lineage")  # one cell, two victims a row
    samples = Samples(run_dir)
    sa, sb, strata, cluster, reps = [], [], [], [], []
    every: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] | None = []  # all-images pairs
    labels: dict[tuple, int] = {}
    for _, r in m.iterrows():
        cell_a, cell_b = (r["cell_id"], r["cell_id"]) if two_victims else (r["cell_id_a"], r["cell_id_b"])
        ta = samples.get(cell_a, r["victim_a" if two_victims else "victim"])
        tb = samples.get(cell_b, r["victim_b" if two_victims else "victim"])
        idx, xa, xb = paired_outcomes(ta, tb)
        hits = paired_hits(ta, tb)
        if by_victim:  # "a resists better": A's success is the image fooling b, B's fooling a
            xa, xb = xb, xa
            hits = None if hits is None else (hits[0], hits[2], hits[1])
        s = labels.setdefault(tuple(r[k] for k in keys), len(labels))
        sa.append(xa)
        sb.append(xb)
        strata.append(np.full(idx.shape, s))
        cluster.append(idx)
        reps.append(np.full(idx.shape, int(r["victim_rep"] if by_victim else
                                           r["replicate_a"] if two_victims else r["replicate"])))
        every = None if every is None or hits is None else every + [(*hits, np.full(hits[0].shape, s))]
    cat = np.concatenate
    sa, sb, strata, cluster, reps = cat(sa), cat(sb), cat(strata), cat(cluster), cat(reps)
    res = compare_paired(sa, sb, strata=strata, cluster=cluster, method="bootstrap", seed=seed)
    per_rep = []
    for k in np.unique(reps):
        sel = reps == k
        per_rep.append(compare_paired(sa[sel], sb[sel], strata=strata[sel], method="newcombe").diff)
    out = {
        "n_pairs": res.n_pairs, "asr_a": res.asr_a, "asr_b": res.asr_b, "diff": res.diff,
        "ci_low": res.diff_ci_low, "ci_high": res.diff_ci_high, "p": res.p_mcnemar,
        "n_victims": int(m["victim_a" if two_victims else "victim"].nunique()), "n_replicates": len(per_rep),
        "rep_min": float(min(per_rep)), "rep_max": float(max(per_rep)),
        "grad_evals_a": float(m["grad_evals_a"].mean()), "grad_evals_b": float(m["grad_evals_b"].mean()),
        "outcomes_sha": _outcomes_sha(sa, sb, cluster),
    }
    if every:  # the same comparison over all images (success = the goal met on x_adv)
        ix, ha, hb, st = (cat([e[k] for e in every]) for k in range(4))
        ra = compare_paired(ha, hb, strata=st, cluster=ix, method="bootstrap", seed=seed)
        out.update(all_n_pairs=ra.n_pairs, all_asr_a=ra.asr_a, all_asr_b=ra.asr_b, all_diff=ra.diff,
                   all_ci_low=ra.diff_ci_low, all_ci_high=ra.diff_ci_high)
    if by_victim:
        # the sides as the claim names them: asr_a is the share of the pairs fooling victim a (so
        # diff = asr_b - asr_a), and each side's clean accuracy on the run's images (mean over its
        # replicates), the cost a defence pays for its resistance
        clean = {s: float(m.drop_duplicates(f"victim_{s}")[f"clean_acc_{s}"].mean()) for s in "ab"}
        out.update(asr_a=res.asr_b, asr_b=res.asr_a, n_sources=int(m["cell_id"].nunique()),
                   clean_a=clean["a"], clean_b=clean["b"])
    return out


def _outcomes_sha(sa: np.ndarray, sb: np.ndarray, images: np.ndarray) -> str:
    """A fingerprint of a row's paired per-image outcomes (both sides' successes and the images, in
    pair order): two regimes with the same fingerprint measured the same thing."""
    import hashlib

    h = hashlib.sha256()
    for arr in (np.asarray(sa, dtype=np.uint8), np.asarray(sb, dtype=np.uint8), np.asarray(images, dtype=np.int64)):
        h.update(arr.tobytes())
    return h.hexdigest()[:16]


def claim_verdict(r: dict[str, Any], min_gain: float) -> str:
    """holds / does not hold / cannot tell (see the module docstring); '' without a result."""
    if not r or math.isnan(r.get("diff", math.nan)):
        return ""
    sig = r["p_holm"] < ALPHA
    if sig and r["diff"] > 0 and r["rep_min"] > 0:
        return "holds"
    if (sig and r["diff"] < 0) or r["ci_high"] < min_gain:
        return "does not hold"
    return "cannot tell"


def grid_name(grid: str) -> str:
    """The ``name:`` of a grid file (its run folder's name), without validating the rest."""
    import yaml

    from ...grid import resolve_grid_path

    path = resolve_grid_path(grid)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    return str(raw.get("name") or path.stem) if isinstance(raw, dict) else path.stem


def claims_table(spec: ClaimsSpec, runs: str | Path, seed: int = 0) -> pd.DataFrame:
    """One row per (claim, regime); for each size its pooled difference, interval, Holm-adjusted p
    (over every row of the size), replicate range, verdict, gradient evaluations per image of each
    side, the all-images difference where recorded, and the claim's label over its regimes
    (:func:`regime_label`), read from ``runs/<size>/<grid name>[@<regime>]/``. A size whose run
    folder is missing leaves its columns empty and says so in ``<size>_note``. A regime whose paired
    per-image outcomes are exactly an earlier regime's of the same claim (its settings changed
    nothing the attacks did) names that regime in ``<size>_same_as`` and is left out of the label."""
    grid_names = {g: grid_name(g) for g in spec.grid_names()}
    first = spec.measured(spec.sizes[0])
    rows: list[dict[str, Any]] = [
        {"id": c.id, "regime": c.regime, "regime_label": spec.regimes[c.regime].label,
         "paper_regime": c.regime == c.paper_regime,
         "paper_source": c.paper_source or (spec.regimes[c.paper_regime].source if c.paper_regime else ""), "by": c.by,
         "claim": c.claim, "paper": c.paper, "setting": c.setting, "paper_number": c.paper_number or "",
         "eps": c.eps_str} for c in first]
    for size in spec.sizes:
        results: list[dict[str, Any]] = []
        measured = spec.measured(size)
        for c in measured:
            if c.skip:
                results.append({"note": f"not measured: {c.skip}"})
                continue
            folders = [Path(runs) / size / c.run_name(grid_names[g], r) for g, r in c.grid_runs()]
            missing = [(g, r) for (g, r), f in zip(c.grid_runs(), folders) if not (f / "results.parquet").is_file()]
            if missing:
                results.append({"note": "not run: " + " and ".join(run_command(spec, g, size, r) for g, r in missing)})
                continue
            results.append(evaluate_whitebox_claim(c, *folders, seed) if c.by == "whitebox"
                           else evaluate_claim(c, folders[0], seed))
        ps = np.array([r.get("p", np.nan) for r in results], dtype=float)
        for r, p in zip(results, holm(ps)):
            if "p" in r:
                r["p_holm"] = float(p)
        seen: dict[tuple[str, str], str] = {}  # (claim, outcomes) -> the first regime that measured them
        for row, c, r in zip(rows, measured, results):  # min_gain is the same at every size
            for k, v in r.items():
                row[f"{size}_{k}"] = v
            row[f"{size}_verdict"] = claim_verdict(r, c.min_gain)
            if r.get("outcomes_sha"):  # a regime that changed nothing the attacks did is not another regime
                row[f"{size}_same_as"] = seen.setdefault((c.id, r["outcomes_sha"]), c.regime)
                if row[f"{size}_same_as"] == c.regime:
                    row[f"{size}_same_as"] = ""
    df = pd.DataFrame(rows)
    for size in spec.sizes:
        same = df[f"{size}_same_as"].fillna("") if f"{size}_same_as" in df else pd.Series("", index=df.index)
        labels = {cid: regime_label([(r, v) for r, v, d in zip(g["regime"], g[f"{size}_verdict"], same[g.index]) if not d])
                  for cid, g in df.groupby("id", sort=False)}
        df[f"{size}_label"] = df["id"].map(labels)
    return df


def run_command(spec: ClaimsSpec, grid: str, size: str, regime: str = STANDARD) -> str:
    """The command that makes the run of ``grid`` in ``regime`` at zoo ``size`` (what ``make
    claims-runs`` runs; ``RUNS`` stands for its runs folder)."""
    sets = "".join(f" {shlex.quote(a)}" for a in spec.regimes[regime].grid_args(grid))
    name = grid_name(grid) + ("" if regime == STANDARD else f"@{regime}")
    return f"advtransfer grid {grid} --size {size}{sets} --out RUNS/{size}/{name} (make claims-runs SIZE={size})"


def regime_label(verdicts: list[tuple[str, str]]) -> str:
    """One claim's label at one size from its (regime, verdict) pairs: ``holds in every regime
    tested``, ``regime-dependent`` (with where it holds and where not), ``holds in no regime
    tested``; with one measured regime, its verdict and ``(one regime measured)``; '' with none."""
    got = [(r, v) for r, v in verdicts if v]
    if not got:
        return ""
    held = [r for r, v in got if v == "holds"]
    if len(got) == 1:
        return f"{got[0][1]} (one regime measured: {got[0][0]})"
    if len(held) == len(got):
        return f"holds in every regime tested ({len(got)})"
    if not held:
        return f"holds in no regime tested ({len(got)})"
    return (f"regime-dependent: holds in {', '.join(held)}; not in "
            + ", ".join(f"{r} ({v})" for r, v in got if v != "holds"))


def _pts(v: float) -> str:
    return f"{100 * v:+.1f}"


def _p(p: float) -> str:
    """A p-value as the table prints it: two significant digits; an exact p below the smallest
    double (it underflows to 0) as "< 1e-300", never "0"."""
    return "< 1e-300" if p == 0 else f"{p:.2g}"


def _count(n: float, noun: str) -> str:
    return f"{int(n)} {noun}" + ("" if int(n) == 1 else "s")


def matched_note(r: pd.Series, s: str) -> str:
    """For a ``by: whitebox`` row of the claims table at size ``s``: the white-box level the baseline
    was matched at, where on its ladder, and the surrogates left out ("" for other rows)."""
    e = r.get(f"{s}_eps_matched")
    if e is None or pd.isna(e):
        return ""
    lad, atk = ("B", "A") if r.get(f"{s}_ladder_side") == "b" else ("A", "B")
    return (f"{lad} read off its ladder at {atk}'s white-box ASR {100 * r[f'{s}_whitebox_attack']:.1f}% "
            f"(mean matched eps {255 * e:.1f}/255, {int(r[f'{s}_n_surrogates'])} surrogates{_left_out(r, s, '; ')})")


def _left_out(r: pd.Series, s: str, sep: str) -> str:
    """``sep`` and the surrogates a ``by: whitebox`` row left out, or "" when none was."""
    out = r.get(f"{s}_surrogates_unmatched") if f"{s}_surrogates_unmatched" in r else None
    return f"{sep}left out, white-box level outside the ladder: {out}" if isinstance(out, str) and out else ""


def _cell(r: pd.Series, s: str) -> str:
    """One (claim, regime) row at size ``s``: "verdict: diff [interval] (p_Holm; replicates) ..."."""
    if f"{s}_diff" not in r or pd.isna(r.get(f"{s}_diff")):
        note = str(r.get(f"{s}_note", ""))
        return "not run" if note.startswith("not run") else note
    reps = (f"; replicates {_pts(r[f'{s}_rep_min'])}..{_pts(r[f'{s}_rep_max'])}"
            if r[f"{s}_n_replicates"] > 1 else "; 1 replicate")
    head = (f"**{r[f'{s}_verdict']}**: {_pts(r[f'{s}_diff'])} pts "
            f"[{_pts(r[f'{s}_ci_low'])}, {_pts(r[f'{s}_ci_high'])}], p_Holm {_p(r[f'{s}_p_holm'])}{reps}; ")
    if r.get("by") == "victim":  # the victims are the arms: ASR on each, from the same examples
        return head + (f"ASR on A {100 * r[f'{s}_asr_a']:.1f}% vs on B {100 * r[f'{s}_asr_b']:.1f}% "
                       f"from {_count(r[f'{s}_n_sources'], 'source')}; clean accuracy A {100 * r[f'{s}_clean_a']:.1f}% "
                       f"vs B {100 * r[f'{s}_clean_b']:.1f}%; grad evals/image {r[f'{s}_grad_evals_a']:.0f}")
    same = r.get(f"{s}_same_as")
    return head + (f"ASR {100 * r[f'{s}_asr_a']:.1f}% vs {100 * r[f'{s}_asr_b']:.1f}% over "
                   f"{int(r[f'{s}_n_victims'])} victims; grad evals/image {r[f'{s}_grad_evals_a']:.0f} vs "
                   f"{r[f'{s}_grad_evals_b']:.0f}{'; ' + matched_note(r, s) if matched_note(r, s) else ''}{_all_note(r, s)}"
                   + (f"; the same per-image outcomes as regime {same} (not counted in the label)"
                      if isinstance(same, str) and same else ""))


def _all_note(r: pd.Series, s: str) -> str:
    """The all-images difference of a row, where its records have it."""
    d = r.get(f"{s}_all_diff")
    if d is None or pd.isna(d):
        return ""
    return (f"; over all images {_pts(d)} pts [{_pts(r[f'{s}_all_ci_low'])}, {_pts(r[f'{s}_all_ci_high'])}] "
            f"(ASR {100 * r[f'{s}_all_asr_a']:.1f}% vs {100 * r[f'{s}_all_asr_b']:.1f}%)")


def _short(r: pd.Series, s: str) -> str:
    """A regime's row in a claim's cell: verdict, difference, interval."""
    if f"{s}_diff" not in r or pd.isna(r.get(f"{s}_diff")):
        note = str(r.get(f"{s}_note", ""))
        return "not run" if note.startswith("not run") else "not measured"
    same = r.get(f"{s}_same_as")
    out = _left_out(r, s, "")
    return (f"{r[f'{s}_verdict']} {_pts(r[f'{s}_diff'])} [{_pts(r[f'{s}_ci_low'])}, {_pts(r[f'{s}_ci_high'])}]"
            + (" (paper's regime)" if r.get("paper_regime") else "")
            + (f" ({out})" if out else "")
            + (f" (the same per-image outcomes as {same}: not counted in the label)" if isinstance(same, str) and same else ""))


def format_claims(df: pd.DataFrame, sizes: tuple[str, ...]) -> str:
    """The claims table as Markdown, one row per claim: per size the claim's label over its
    regimes, then its standard regime's "diff [interval] (p_holm; replicates lo..hi) verdict" in
    points with gradient evaluations per image A/B, then each other regime in one phrase."""
    head = ["claim", "paper, setting", "paper's number"] + [f"{s} zoo" for s in sizes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, g in df.groupby("id", sort=False):
        std = g[g["regime"] == STANDARD].iloc[0] if (g["regime"] == STANDARD).any() else g.iloc[0]
        cells = [std["claim"], f"{std['paper']}; {std['setting']}".strip("; "), std["paper_number"] or "n/a"]
        for s in sizes:
            label = std.get(f"{s}_label") or ""
            others = [f"{r['regime']} ({r['eps']}): {_short(r, s)}" for _, r in g.iterrows()
                      if r["regime"] != STANDARD and not str(r.get(f"{s}_note", "")).startswith("not measured: regime")]
            lead = f"*{label}*. " if label and others else ""
            cells.append(lead + _cell(std, s) + ("" if not others else "; other regimes: " + "; ".join(others)))
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def format_regimes(df: pd.DataFrame, sizes: tuple[str, ...]) -> str:
    """The full per-regime table as Markdown: one row per (claim, regime) with its regime's label,
    ε and, per size, the row of :func:`format_claims`'s standard cell."""
    head = ["claim", "regime", "ε"] + [f"{s} zoo" for s in sizes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in df.iterrows():
        reg = f"`{r['regime']}`: {r['regime_label']}" + (" (the paper's)" if r.get("paper_regime") else "")
        cells = [r["id"], reg, r["eps"]] + [_cell(r, s) for s in sizes]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)
