"""Golden regression baselines: a run's per-image outcomes committed as a small table, and a
paired check of a new run against them.

A directional band ("white-box ASR ≥ 0.95", "transfer below white-box") lets a change through that
moves every number by a few points. A golden baseline pins the counts themselves: per row
(surrogate, attack_label, eps_str, seed, victim[, replicate]) the number of images ``n``,
``n_clean_correct``, ``n_success`` and the per-image bits, so that a later run can be compared
with it image by image.

Baseline folder (``results/baselines/<grid>/``, committed):

- ``counts.csv``: one line per row, sorted by the key. ``clean_hex`` and ``success_hex`` are
  the per-image bits as a hexadecimal integer whose bit ``k`` is dataset index ``k`` (bit set:
  the victim classifies image ``k`` correctly / the attack succeeds on it, as counted in
  ``n_clean_correct`` / ``n_success``). ``surrogate_sha``/``victim_sha`` are the first 12 hex
  digits of the weights' sha256 (joined by ``+`` for a set), ``attack_version`` and
  ``attack_params`` say which attack code and parameters made the row.
- ``meta.json``: what made it: git sha, advtransfer / torch / numpy versions, torch thread
  count, CPU capability (``torch.backends.cpu.get_cpu_capability()``), grid, zoo checksums,
  time, the command that refreshes it, and (with ``zoo/``) the ``kernel_probe`` below.
- ``zoo/<size>/<name>.safetensors`` and ``.json`` (optional; the ci baseline has them): the very
  models the rows were made with, laid out as the project's shipped zoo, so a check runs the grid
  on them (``ADVTRANSFER_SHIPPED_ZOO=<baseline>/zoo``) instead of on models trained anew. Training
  is not bit-reproducible across machine kinds (below), and a retrained ci model is another sample
  of its recipe, whose transfer differs by more than any regression tolerance: measured, one CI
  machine's retrained ci zoo moved 22 of the 60 rows by up to 17.7 ASR points with unchanged code.
  A regression check has to hold the models fixed.

The tolerance rule (:class:`Tolerance`). Rows are paired on the images that the victim
classifies correctly both in the baseline and now (the images both ASRs count); ``b`` = images
the attack fools now but not in the baseline, ``c`` = the reverse.

**Same weights, same kernels (exact).** When the row's surrogate and victim weights are the
baseline's (the checksums in the table agree) and this machine's float32 kernels round as the
baseline's did (:func:`kernel_probe` agrees, or the baseline has no probe), a row moved as soon as
more than ``max_flips_same_weights`` = 0 images changed (``b + c > 0``) or a count changed. Why:
the ci run is bit-reproducible on the same kind of machine (same torch, thread count and kernels;
measured: independent trainings at a fixed thread count give identical weight checksums, and 1 vs
2 threads give different ones), so with the baseline's weights there is no float noise left to
tolerate, and any flipped image is a code change in crafting or evaluation. The probe decides
"same kind", not the CPU's name or ISA: pinning AVX2 kernels made one AMD EPYC reproduce an AVX2
baseline bit for bit, yet an Intel Xeon (Sapphire Rapids) with the same pin, and one CI machine,
trained other ci weights than the baseline's machine. Statistics cannot do this job: a
+10% I-FGSM step size flips a few images in some of the ci rows, in both directions, which no
paired test tells from noise, yet it is a change (results/notes/settings-measurements.md).

**Same weights, other kernels, or different weights (statistical).** When the probe differs
(another machine kind rounds differently in BLAS/oneDNN), crafting on the baseline's weights
differs by float noise: a few boundary images flip, in both directions. When the weights differ
(a run on models trained anew), the rows compare different models. Either way a row moved when

1. the exact two-sided McNemar test on the discordant images rejects at ``alpha`` = 0.01
   (:func:`advtransfer.analysis.stats.mcnemar_exact`): it needs at least 8 discordant images all
   in one direction (2·2⁻⁸ = 0.0078), which scattered boundary flips in both directions never give;
2. the paired ASR change ``(b - c) / n_pairs`` exceeds ``max_points`` = 5 percentage points (a
   large change with mixed discordance; the "every number shifted by 5 points" regression); or
3. its group shifted: over all rows of one (attack_label, eps_str, seed, replicate) the summed
   discordant counts give p < ``alpha_group`` = 0.001 in the exact stratified test
   (:func:`advtransfer.analysis.stats.stratified_paired_test`; the rows share images, so this p
   is optimistic, hence the stricter level); each row of the group leaning the group's way is named.

Rules 1-2 are per row and deliberately not corrected for the number of rows: a false alarm costs
one look at the named rows; a missed regression costs a wrong table. The message says when the
weights differ and how the environment differs from the baseline's (``meta.json``).

Rows present in only one of the two (a new attack, a dropped victim) are reported as ``new`` /
``missing`` and fail the check too.
"""
from __future__ import annotations

import json
import math
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from ...core.errors import UserError
from ..stats import mcnemar_exact, stratified_paired_test

COUNTS_FILE = "counts.csv"
META_FILE = "meta.json"
KEY = ("surrogate", "attack_label", "eps_str", "seed", "victim", "replicate")
COUNTS = ("n", "n_clean_correct", "n_success")
GROUP = ("attack_label", "eps_str", "seed", "replicate")
INFO = ("attack", "attack_version", "attack_params", "surrogate_sha", "victim_sha")
COLUMNS = (*KEY, *COUNTS, "clean_hex", "success_hex", *INFO)
REFRESH_COMMAND = "make golden-update"
SHA_DIGITS = 12


@dataclass(frozen=True)
class Tolerance:
    """When a row counts as moved (see the module docstring for why).

    ``alpha``: level of the exact two-sided McNemar test on the discordant images (per row).
    ``max_points``: largest allowed change of the paired ASR, in percentage points (0-100 scale).
    ``alpha_group``: level of the exact stratified test over the rows of one (attack_label, eps_str, seed).
    ``max_flips_same_weights``: images allowed to change in a row whose weights are the baseline's.
    The first three apply only to rows whose surrogate or victim weights differ from the baseline's.
    """

    alpha: float = 0.01
    max_points: float = 5.0
    alpha_group: float = 0.001
    max_flips_same_weights: int = 0

    def __post_init__(self) -> None:
        if self.max_flips_same_weights < 0:
            raise UserError(f"tolerance max_flips_same_weights must be >= 0, got {self.max_flips_same_weights}")
        for name in ("alpha", "alpha_group"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise UserError(f"tolerance {name} must be in (0, 1), got {getattr(self, name)}")
        if not self.max_points >= 0.0:
            raise UserError(f"tolerance max_points must be >= 0 percentage points, got {self.max_points}")

    def describe(self) -> str:
        return (f"with the baseline's weights and kernels: more than {self.max_flips_same_weights} image(s) changed; "
                f"with other weights or kernels: exact McNemar p < {self.alpha:g} on the discordant images, "
                f"or |ASR change| > {self.max_points:g} points on the paired images, "
                f"or the row's (attack, eps, seed) group shifted with stratified p < {self.alpha_group:g}")


@dataclass
class Moved:
    """One row that fails the check. ``status``: 'moved', 'new' (only in the run) or 'missing'
    (only in the baseline). Counts are ``(n, n_clean_correct, n_success)``; ``diff_points`` is the
    paired ASR change now − baseline in percentage points; ``now_only``/``base_only`` are McNemar's
    discordant counts."""

    key: dict
    status: str
    before: tuple[int, int, int] | None = None
    after: tuple[int, int, int] | None = None
    n_pairs: int = 0
    now_only: int = 0
    base_only: int = 0
    p_mcnemar: float = math.nan
    diff_points: float = math.nan
    weights_changed: bool = False
    reasons: list[str] = field(default_factory=list)

    def label(self) -> str:
        k = self.key
        rep = f" · replicate {k['replicate']}" if int(k.get("replicate", 0)) else ""
        return (f"{k['attack_label']} · {k['surrogate']} -> {k['victim']} · eps {k['eps_str']} · "
                f"seed {k['seed']}{rep}")

    def describe(self) -> str:
        def counts(c: tuple[int, int, int]) -> str:
            asr = 100 * c[2] / c[1] if c[1] else math.nan
            return f"{c[2]}/{c[1]} fooled of {c[0]} (ASR {asr:.1f}%)"

        if self.status == "new":
            return f"new row (not in the baseline): {self.label()}: {counts(self.after)}"
        if self.status == "missing":
            return f"missing row (in the baseline, not in this run): {self.label()}: {counts(self.before)}"
        note = "; models' weights differ from the baseline's" if self.weights_changed else ""
        return (f"{self.label()}: {counts(self.before)} -> {counts(self.after)}; paired on {self.n_pairs} images "
                f"{self.diff_points:+.1f} points (now only {self.now_only}, baseline only {self.base_only}, "
                f"McNemar p = {self.p_mcnemar:.2g}; {', '.join(self.reasons)}){note}")


# --- bits ------------------------------------------------------------------------------------------

def bits_to_hex(index: np.ndarray, bits: np.ndarray) -> str:
    """Hex string of the integer with bit ``index[i]`` set where ``bits[i]`` (shapes (n,));
    '0' when none is set."""
    v = 0
    for i in np.asarray(index, dtype=np.int64)[np.asarray(bits, dtype=bool)]:
        v |= 1 << int(i)
    return format(v, "x")


def hex_to_bits(h: str, length: int) -> np.ndarray:
    """Boolean array of shape (length,): entry k is bit k of the hex integer ``h``."""
    v = int(str(h), 16)
    if v >> length:
        length = v.bit_length()
    return np.array([(v >> k) & 1 for k in range(length)], dtype=bool)


# --- tables --------------------------------------------------------------------------------------

def _short(sha: object) -> str:
    return "+".join(s[:SHA_DIGITS] for s in str(sha).split("+")) if isinstance(sha, str) and sha else ""


def counts_table(run_dir: str | Path) -> pd.DataFrame:
    """The run's rows in baseline form (columns :data:`COLUMNS`, sorted by :data:`KEY`), read
    from ``RUN/results.parquet`` and the per-image tables ``RUN/samples/<cell_id>.parquet``."""
    from ..runs import read_results

    df = read_results(run_dir)
    from ...run.store import RunStore

    samples = Path(run_dir) / "samples"
    store = RunStore(run_dir)
    rows = []
    for cell_id, g in df.groupby("cell_id", sort=False):
        path = samples / f"{cell_id}.parquet"
        s = store.read_samples(cell_id, required=True)[["victim", "index", "clean_correct", "success"]]
        for _, r in g.iterrows():
            sv = s[s["victim"] == r["victim"]]
            if len(sv) != int(r["n"]) or int(sv["clean_correct"].sum()) != int(r["n_clean_correct"]) \
                    or int(sv["success"].sum()) != int(r["n_success"]):
                raise UserError(f"{path} does not agree with results.parquet for victim {r['victim']!r} "
                                "(a run interrupted mid-write?); rerun `advtransfer grid` into a new folder")
            idx = sv["index"].to_numpy()
            rows.append({
                **{k: r[k] for k in KEY}, **{k: int(r[k]) for k in COUNTS},
                "clean_hex": bits_to_hex(idx, sv["clean_correct"].to_numpy()),
                "success_hex": bits_to_hex(idx, sv["success"].to_numpy()),
                "attack": r["attack"], "attack_version": int(r.get("attack_version", 0)),
                "attack_params": r["attack_params"], "surrogate_sha": _short(r.get("surrogate_sha")),
                "victim_sha": _short(r.get("victim_sha")),
            })
    return _normalise(pd.DataFrame(rows, columns=list(COLUMNS)))


def _normalise(t: pd.DataFrame) -> pd.DataFrame:
    t = t.copy()
    for k in ("seed", "replicate", *COUNTS, "attack_version"):
        t[k] = t[k].astype("int64")
    for k in ("surrogate", "attack_label", "eps_str", "victim", "clean_hex", "success_hex", "attack",
              "attack_params", "surrogate_sha", "victim_sha"):
        t[k] = t[k].fillna("").astype(str)
    return t.sort_values(list(KEY), kind="stable").reset_index(drop=True)


def read_baseline(baseline_dir: str | Path) -> tuple[pd.DataFrame, dict]:
    """``(counts table, meta)`` of a baseline folder."""
    d = Path(baseline_dir)
    path = d / COUNTS_FILE
    if not path.is_file():
        raise UserError(f"{path} does not exist: no golden baseline there; create it with "
                        f"`advtransfer golden RUN --update --baseline {d}` (or `{REFRESH_COMMAND}` for the ci grid)")
    t = pd.read_csv(path, dtype={"clean_hex": str, "success_hex": str, "eps_str": str}, keep_default_na=False)
    missing = [c for c in COLUMNS if c not in t.columns]
    if missing:
        raise UserError(f"{path} lacks column(s) {', '.join(missing)}; refresh it with `{REFRESH_COMMAND}`")
    meta_path = d / META_FILE
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    return _normalise(t[list(COLUMNS)]), meta


def environment(threads: int | None = None) -> dict:
    """What decides the bits besides the code: versions, torch thread count, CPU capability."""
    import torch

    from ...core.utils import versions

    return {"versions": versions(), "threads": int(threads if threads is not None else torch.get_num_threads()),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "machine": platform.machine(),
            "python": platform.python_version()}


MODELS_DIR = "zoo"
#: images per probe batch when a baseline's meta.json does not record its probe batch
PROBE_BATCH = 100


def baseline_models(baseline_dir: str | Path) -> Path | None:
    """``<baseline>/zoo`` when the baseline keeps the models its rows were made with (laid out as
    the shipped zoo: pass it as ``ADVTRANSFER_SHIPPED_ZOO``), else None."""
    root = Path(baseline_dir) / MODELS_DIR
    return root if any(root.glob("*/*.json")) else None


def copy_models(zoo: dict, size: str, cache: str | Path, out_dir: str | Path) -> Path:
    """Copy the models of a run's manifest (``zoo``: name -> card with ``sha256``) from
    ``cache/zoo/<size>/`` (or the shipped zoo, where the run took them from) into
    ``OUT/zoo/<size>/``, checking every weights file against the checksum the run recorded."""
    import shutil

    from ...models.store import locate
    from ...core.utils import sha256_file

    final = Path(out_dir) / MODELS_DIR
    staging = Path(out_dir) / f".{MODELS_DIR}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / size).mkdir(parents=True)
    try:
        for name, card in sorted(zoo.items()):
            weights, card_file = locate(name, size, cache)
            if not weights.is_file() or sha256_file(weights) != card.get("sha256"):
                raise UserError(f"model {name!r} in {weights.parent} is not the one the run used (checksum differs "
                                "or file missing); rerun the grid with this cache before writing its baseline")
            shutil.copyfile(weights, staging / size / weights.name)
            shutil.copyfile(card_file, staging / size / card_file.name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    return final


def kernel_probe(models_root: str | Path, size: str, threads: int, batch: int = PROBE_BATCH) -> str:
    """sha256 (first 16 hex digits) of what this machine's float32 kernels compute on the models
    in ``models_root/<size>/``: for each (sorted by name), logits and the input gradient of the
    cross-entropy on ``batch`` seeded random images (3×32×32 in [0,1]) at ``threads`` torch
    threads — the forward and backward passes a grid's crafting and evaluation run. Equal probes:
    the kernels round alike, and runs on these weights are bit-reproducible between the machines."""
    import hashlib

    import torch

    from ...models.catalogue import get_spec
    from ...models.loading import instantiate
    from ...models.store import read_states

    root = Path(models_root) / size
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    h = hashlib.sha256()
    try:
        for card_file in sorted(root.glob("*.json")):
            name = card_file.stem
            card = json.loads(card_file.read_text())
            spec = get_spec(name)
            states = read_states(root / f"{name}.safetensors", card.get("sha256"), card.get("members", [""]), name)
            x = torch.rand(batch, 3, 32, 32, generator=torch.Generator().manual_seed(0))
            y = torch.arange(batch) % 10
            for member, state in states.items():
                net = instantiate(spec, state, f"{name}[{member}]", size)
                xi = x.clone().requires_grad_(True)
                logits = net(xi)
                (grad,) = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, y), xi)
                h.update(logits.detach().numpy().tobytes())
                h.update(grad.numpy().tobytes())
    finally:
        torch.set_num_threads(old)
    return h.hexdigest()[:16]


def same_kernels(meta: dict, baseline_dir: str | Path, threads: int | None = None) -> bool:
    """Whether this machine's kernels round as the baseline's did (:func:`kernel_probe` on the
    baseline's models equals ``meta['kernel_probe']``); True for a baseline without a probe (the
    checksums alone then decide, as before probes existed)."""
    root = baseline_models(baseline_dir)
    if root is None or not meta.get("kernel_probe"):
        return True
    probe = kernel_probe(root, str(meta.get("zoo_size")), int(threads or meta.get("threads") or 1),
                         int(meta.get("probe_batch") or PROBE_BATCH))
    return probe == meta["kernel_probe"]


def write_baseline(run_dir: str | Path, out_dir: str | Path, threads: int | None = None,
                   models_from: str | Path | None = None) -> Path:
    """Write ``OUT/counts.csv`` and ``OUT/meta.json`` from the run folder ``run_dir`` (atomically);
    returns ``OUT``. ``threads``: the torch thread count the run used (default: this process's,
    right when the run was made in this process, as in the tests and ``make golden-update``).
    ``models_from``: the cache the run's models came from; they are copied into ``OUT/zoo/``
    (:func:`copy_models`) and the meta gets their :func:`kernel_probe`."""
    from ...grid.runspec import RunSpec
    from ...run.store import RunStore
    from ...core.utils import atomic_path, atomic_write_text

    t = counts_table(run_dir)
    if t.empty:
        raise UserError(f"{run_dir} has no rows; nothing to write as a baseline")
    manifest = RunStore(run_dir).read_manifest()
    out = Path(out_dir)
    spec = RunSpec.from_manifest(manifest)
    env = environment(threads)
    probe = {}
    if models_from is not None:
        root = copy_models(manifest.get("zoo") or {}, spec.size, models_from, out)
        batch = spec.batch_size  # the batch the run crafted in
        probe = {"kernel_probe": kernel_probe(root, spec.size, env["threads"], batch), "probe_batch": batch}
    with atomic_path(out / COUNTS_FILE) as tmp:
        t.to_csv(tmp, index=False, lineterminator="\n")
    meta = {
        "grid": spec.name, "n": spec.n, "zoo_size": spec.size, "rows": len(t),
        "git_sha": manifest.get("git_sha"), **env, **probe,
        "zoo_sha256": {m: c.get("sha256") for m, c in sorted((manifest.get("zoo") or {}).items())},
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "refresh": REFRESH_COMMAND,
        "bits": "clean_hex/success_hex: hex integer, bit k = dataset index k",
    }
    atomic_write_text(out / META_FILE, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out


# --- the check ----------------------------------------------------------------------------------

def compare_tables(now: pd.DataFrame, base: pd.DataFrame, tolerance: Tolerance | None = None,
                   exact: bool = True) -> tuple[list[Moved], int]:
    """Rows of ``now`` that moved against ``base`` (both in :func:`counts_table` form), plus rows
    only in one of them; and the number of rows that differ but stay within ``tolerance``.
    ``exact``: whether rows with the baseline's weights must match bit for bit (this machine's
    kernels round as the baseline's, :func:`same_kernels`); False holds them to the statistical rule."""
    tol = tolerance or Tolerance()
    keys = list(KEY)
    m = now.merge(base, on=keys, how="outer", suffixes=("_now", "_base"), indicator=True)
    out: list[Moved] = []
    differing: list[Moved] = []
    within = 0
    for _, r in m.iterrows():
        key = {k: r[k] for k in keys}
        after = tuple(int(r[f"{c}_now"]) for c in COUNTS) if r["_merge"] != "right_only" else None
        before = tuple(int(r[f"{c}_base"]) for c in COUNTS) if r["_merge"] != "left_only" else None
        if r["_merge"] == "left_only":
            out.append(Moved(key, "new", after=after))
            continue
        if r["_merge"] == "right_only":
            out.append(Moved(key, "missing", before=before))
            continue
        if before == after and r["clean_hex_now"] == r["clean_hex_base"] and r["success_hex_now"] == r["success_hex_base"]:
            continue
        length = max(before[0], after[0], 1)
        cn, cb = hex_to_bits(r["clean_hex_now"], length), hex_to_bits(r["clean_hex_base"], length)
        sn, sb = hex_to_bits(r["success_hex_now"], length), hex_to_bits(r["success_hex_base"], length)
        L = max(len(cn), len(cb), len(sn), len(sb))
        cn, cb, sn, sb = (np.pad(a, (0, L - len(a))) for a in (cn, cb, sn, sb))
        pairs = cn & cb
        b, c = int((sn & ~sb & pairs).sum()), int((sb & ~sn & pairs).sum())
        n_pairs = int(pairs.sum())
        p = mcnemar_exact(b, c)
        diff = 100.0 * (b - c) / n_pairs if n_pairs else 0.0
        weights = (r["surrogate_sha_now"] != r["surrogate_sha_base"]) or (r["victim_sha_now"] != r["victim_sha_base"])
        mv = Moved(key, "moved", before, after, n_pairs, b, c, p, diff, bool(weights), [])
        if not weights and exact:
            flips = int((sn != sb).sum() + (cn != cb).sum())
            if flips > tol.max_flips_same_weights or (before != after and tol.max_flips_same_weights == 0):
                mv.reasons.append(f"{flips} image(s) changed with the baseline's weights")
            (out if mv.reasons else []).append(mv)
            within += not mv.reasons
            continue
        if p < tol.alpha:
            mv.reasons.append(f"p < {tol.alpha:g}")
        if abs(diff) > tol.max_points:
            mv.reasons.append(f"|change| > {tol.max_points:g} points")
        differing.append(mv)
    groups: dict[tuple, list[Moved]] = {}
    for mv in differing:
        groups.setdefault(tuple(mv.key[k] for k in GROUP), []).append(mv)
    for rows in groups.values():
        _, p_group, _ = stratified_paired_test([(0, mv.now_only, mv.base_only, 0) for mv in rows])
        up = sum(mv.now_only for mv in rows) > sum(mv.base_only for mv in rows)
        if p_group < tol.alpha_group:
            for mv in rows:
                if (mv.now_only > mv.base_only) if up else (mv.base_only > mv.now_only):
                    mv.reasons.append(f"group {'up' if up else 'down'}, stratified p = {p_group:.2g}")
    for mv in differing:
        if mv.reasons:
            out.append(mv)
        else:
            within += 1
    order = {"moved": 0, "new": 1, "missing": 2}
    out.sort(key=lambda mv: (order[mv.status], -abs(mv.diff_points) if mv.status == "moved" else 0.0))
    return out, within


def check_against_baseline(run_dir: str | Path, baseline_dir: str | Path,
                           tolerance: Tolerance | None = None) -> list[Moved]:
    """The rows of ``run_dir`` that moved beyond ``tolerance`` (default :class:`Tolerance`)
    against the baseline in ``baseline_dir``, and rows present in only one of them; empty when
    the run matches. See the module docstring for the rule."""
    base, meta = read_baseline(baseline_dir)
    moved, _ = compare_tables(counts_table(run_dir), base, tolerance, exact=same_kernels(meta, baseline_dir))
    return moved


def environment_notes(meta: dict, threads: int | None = None) -> list[str]:
    """Lines on what differs between the baseline's environment (``meta``) and this process's."""
    now = environment(threads)
    notes = []
    for what, a, b in (("torch", (meta.get("versions") or {}).get("torch"), now["versions"].get("torch")),
                       ("torch threads", meta.get("threads"), now["threads"]),
                       ("CPU capability", meta.get("cpu_capability"), now["cpu_capability"])):
        if a is not None and a != b:
            notes.append(f"{what}: baseline {a}, now {b}")
    return notes


def failure_message(moved: Sequence[Moved], run_dir: str | Path, baseline_dir: str | Path,
                    tolerance: Tolerance | None = None, meta: dict | None = None, n_rows: int | None = None,
                    exact: bool = True) -> str:
    """The text a failed check prints: each moved/new/missing row with its counts before and after,
    the rule, environment differences, and the command that refreshes the baseline."""
    tol = tolerance or Tolerance()
    n_moved = sum(m.status == "moved" for m in moved)
    total = f" of {n_rows}" if n_rows is not None else ""
    lines = [f"golden check failed: {run_dir} against {baseline_dir}: {n_moved}{total} rows moved "
             f"({tol.describe()}), {sum(m.status == 'new' for m in moved)} new, "
             f"{sum(m.status == 'missing' for m in moved)} missing"]
    lines += [f"  {m.describe()}" for m in moved]
    if any(m.weights_changed for m in moved):
        models = baseline_models(baseline_dir)
        hint = (f"; run the grid on the baseline's own models (ADVTRANSFER_SHIPPED_ZOO={models})" if models else "")
        lines.append("note: some models' weights differ from the baseline's: the zoo trained differently "
                     "(training code, torch version, thread count or CPU kind), and rows may move for that reason alone"
                     + hint)
    if not exact:
        lines.append("note: this machine's float32 kernels round differently from the baseline's (kernel probe "
                     "differs), so rows on the baseline's weights were held to the statistical rule, not bit for bit")
    if meta:
        notes = environment_notes(meta)
        if notes:
            lines.append("note: environment differs from the baseline's: " + "; ".join(notes))
    lines.append(f"If the change is intended, refresh the baseline with `{REFRESH_COMMAND}` "
                 f"(or `advtransfer golden RUN --update --baseline {baseline_dir}`) and commit it.")
    return "\n".join(lines)
