"""Adversarial and knowledge transferability (Liang et al., ICML 2021, "Uncovering the connections
between adversarial transferability and knowledge transferability").

For a source model f_S and a target f_T (here: a model fine-tuned from f_S, ``init_from``, which
may predict another label set), with δ_f(x) an untargeted L∞ PGD perturbation against model f's
*own* prediction on x and Δ_{A→B}(x) = f_B(x + δ_{f_A}(x)) − f_B(x) the change of B's logits under
A's perturbation, the paper's two metrics are

    α1 = E_x[ ‖Δ_{S→T}(x)‖₂ / ‖Δ_{T→T}(x)‖₂ ]
         (how much S's perturbation moves T, relative to T's own white-box perturbation)
    α2 = ‖ E_x[ unit(Δ_{S→S}(x)) · unit(Δ_{S→T}(x))ᵀ ] ‖_F
         (how consistently S's perturbation moves S and T, a d_S × d_T matrix: no map between the
         two output spaces is needed)

with the expectation over test images the target classifies correctly (as in the authors' code).
The authors' code reports the *squared* Frobenius norm for α2 and uses 50 PGD steps at ε = 0.1 on
STL-10; here α2 is the norm itself (as written in the paper's definition) and the attack is the
harness's PGD at the chosen ε and steps. Knowledge transferability is measured as the fine-tuning
gain: the descendant's clean accuracy on its task minus that of the same architecture trained from
scratch on the same data and label set (an entry without ``init_from``). The paper shows the two
rise together; :func:`correlations` gives Spearman's ρ over the (source, descendant) pairs with its
exact or permutation p-value and a bootstrap interval over the pairs.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from ...core.errors import UserError
from ...core.metrics import predict_batched


def own_label_pgd(model: nn.Module, x: torch.Tensor, index: torch.Tensor, eps: float, steps: int,
                  seed: int = 0, batch_size: int = 250) -> torch.Tensor:
    """x_adv: untargeted L∞ PGD (random start, α = 2.5ε/T) against ``model``'s own top-1 labels
    on ``x`` (pixels in [0,1], N×C×H×W); label-free in the sense of the paper: the ground truth is
    not used, so models with any label set can be attacked."""
    from ...attacks import create_attack
    from ...attacks.base import SurrogateSet

    attack = create_attack("pgd", eps=eps, steps=steps, seed=seed)
    S = SurrogateSet([model], ["model"])
    own = predict_batched(model, x, batch_size).argmax(1)
    out = [attack(S, x[s:s + batch_size], own[s:s + batch_size], index[s:s + batch_size])
           for s in range(0, len(x), batch_size)]
    return torch.cat(out).detach()




def transfer_metrics(source: nn.Module, target: nn.Module, x: torch.Tensor, index: torch.Tensor, eps: float,
                     steps: int = 20, seed: int = 0) -> dict[str, float]:
    """α1 and α2 of source → target on ``x`` (see the module docstring), with the ASR of the
    source's perturbation on the target (its prediction changed) for reference."""
    xs = own_label_pgd(source, x, index, eps, steps, seed)
    xt = own_label_pgd(target, x, index, eps, steps, seed)
    with torch.no_grad():  # each model's logits once per input set
        ft, ft_s = predict_batched(target, x).double(), predict_batched(target, xs).double()
        d_st, d_tt = ft_s - ft, predict_batched(target, xt).double() - ft
        d_ss = (predict_batched(source, xs) - predict_batched(source, x)).double()
    ratio = d_st.norm(dim=1) / d_tt.norm(dim=1).clamp_min(1e-12)
    u_ss = d_ss / d_ss.norm(dim=1, keepdim=True).clamp_min(1e-12)
    u_st = d_st / d_st.norm(dim=1, keepdim=True).clamp_min(1e-12)
    outer = torch.einsum("ni,nj->ij", u_ss, u_st) / len(x)
    changed = (ft_s.argmax(1) != ft.argmax(1)).double().mean()
    return {"alpha1": float(ratio.mean()), "alpha2": float(outer.norm()), "own_change_rate": float(changed),
            "n_images": len(x)}


def _recipe(spec, size: str) -> dict | None:
    """The recipe ``spec`` is trained with at ``size``; None: not trained by the harness there."""
    from ...models.sources import declared

    return declared(spec).recipe_at(size) if size in spec.recipe.get("sizes", {}) else None


def _scratch_for(name: str, specs: dict, size: str) -> list[str]:
    """Entries trained from scratch with the same architecture, data variant and label set as ``name``."""
    from ...models.catalogue import get_spec

    spec = get_spec(name, specs)
    want = (spec.arch, json.dumps(spec.arch_kwargs, sort_keys=True), spec.data_variant(size).describe())
    out = []
    for other in specs.values():
        rec = _recipe(other, size)
        if other.name == name or rec is None or rec.get("init_from") or rec.get("method", "standard") != "standard":
            continue
        if (other.arch, json.dumps(other.arch_kwargs, sort_keys=True), other.data_variant(size).describe()) == want:
            out.append(other.name)
    return out


def knowledge_table(descendants: list[str] | None, size: str, n: int = 500, eps: float = 8 / 255, steps: int = 20,
                    cache=None, data_dir=None, device: str = "cpu", log=print) -> pd.DataFrame:
    """One row per fine-tuned descendant (a trained entry with ``init_from``; all of them when
    ``descendants`` is None): its source, α1 and α2 on test images 0..n-1 it classifies correctly
    (in its task), and the fine-tuning gain over its scratch twins."""
    from ...data import eval_subset, load_dataset
    from ...models.cards import read_card
    from ...models.catalogue import get_spec, load_specs
    from ...models.sources import load_model

    specs = load_specs()
    if not descendants:
        descendants = [s.name for s in specs.values() if (r := _recipe(s, size)) and r.get("init_from")
                       and r.get("method", "standard") == "standard" and read_card(s.name, size, cache) is not None]
        if not descendants:
            raise UserError(f"no fine-tuned model (an entry with init_from) is trained at size {size}; "
                            f"train some first, e.g. `advtransfer zoo train ds_resnet_va --size {size}`")
    pairs = []
    for d in descendants:  # every descendant checked before any image is crafted
        spec = get_spec(d, specs)
        src = spec.resolved_recipe(size).get("init_from") if spec.recipe.get("sizes") else None
        if not src:
            raise UserError(f"model {d!r} has no init_from: knowledge transfer needs a model fine-tuned from a source")
        cards = {m: read_card(m, size, cache) for m in (d, src)}
        missing = [m for m, c in cards.items() if c is None]
        if missing:
            raise UserError(f"{', '.join(missing)} not trained at size {size}; run `advtransfer zoo train {' '.join(missing)} --size {size}`")
        pairs.append((d, spec, src, cards))
    rows = []
    for d, spec, src, cards in pairs:
        variant = spec.data_variant(size)
        test = load_dataset(f"{spec.dataset}-{variant.shift}" if variant.shift != "none" else spec.dataset, "test", data_dir)
        x, y, index = eval_subset(test, min(n, len(test)))
        target, source = load_model(d, size, cache, device, member=0), load_model(src, size, cache, device, member=0)
        lm = getattr(target, "label_map", None)
        yt = lm[y] if lm is not None else y
        ok = predict_batched(target, x).argmax(1) == yt
        log(f"knowledge: {src} -> {d} on {int(ok.sum())} images")
        m = transfer_metrics(source, target, x[ok], index[ok], eps, steps)
        twins = [t for t in _scratch_for(d, specs, size) if read_card(t, size, cache) is not None]
        scratch_acc = float(np.mean([read_card(t, size, cache)["clean_acc"] for t in twins])) if twins else float("nan")
        rows.append({"descendant": d, "source": src, "labels": variant.labels, "data": variant.describe(),
                     "finetune": spec.resolved_recipe(size).get("finetune", "full"), "eps": eps, "steps": steps, **m,
                     "acc_descendant": cards[d]["clean_acc"], "acc_source": cards[src]["clean_acc"],
                     "scratch": ",".join(twins), "acc_scratch": scratch_acc,
                     "gain": cards[d]["clean_acc"] - scratch_acc})
    return pd.DataFrame(rows)


def correlations(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Spearman's ρ between each transferability measure (α1, α2, own_change_rate) and the
    fine-tuning gain over the rows (pairs), its p-value (scipy: exact for small n) and a
    percentile bootstrap interval over the pairs: over all pairs (``task`` = ``all``) and within
    each downstream label set. Pooled over tasks, ρ also reflects how the tasks differ (a task
    whose perturbations transfer more may also gain more from fine-tuning); within a task it
    compares sources, which is the paper's claim."""
    d = df[np.isfinite(df["gain"])]
    parts = [_correlations(d, "all", n_boot, seed)]
    parts += [_correlations(g, str(lab), n_boot, seed) for lab, g in d.groupby("labels") if d["labels"].nunique() > 1]
    return pd.concat(parts, ignore_index=True)


def _correlations(d: pd.DataFrame, task: str, n_boot: int, seed: int) -> pd.DataFrame:
    from scipy.stats import spearmanr

    out = []
    rng = np.random.default_rng(seed)
    for col in ("alpha1", "alpha2", "own_change_rate"):
        if len(d) < 3:
            out.append({"task": task, "measure": col, "n_pairs": len(d), "rho": float("nan"), "p": float("nan"),
                        "rho_ci_low": float("nan"), "rho_ci_high": float("nan")})
            continue
        r = spearmanr(d[col], d["gain"])
        boots = []
        for _ in range(n_boot):
            i = rng.integers(0, len(d), len(d))
            a, b = d[col].to_numpy()[i], d["gain"].to_numpy()[i]
            if len(set(a)) > 1 and len(set(b)) > 1:
                boots.append(spearmanr(a, b).statistic)
        lo, hi = np.percentile(boots, [2.5, 97.5]) if boots else (np.nan, np.nan)
        out.append({"task": task, "measure": col, "n_pairs": len(d), "rho": float(r.statistic), "p": float(r.pvalue),
                    "rho_ci_low": float(lo), "rho_ci_high": float(hi)})
    return pd.DataFrame(out)


def scatter(df: pd.DataFrame, out: str | Path) -> Path:
    """α1 and α2 against the fine-tuning gain, one point per (source, descendant)."""
    from ..plots import pyplot

    plt = pyplot()

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    # the downstream task; a descendant on the source's own label set was adapted to other data
    task = [lab if lab != "cifar10" else f"same labels, {data}" for lab, data in zip(df["labels"], df["data"])]
    for ax, col, name in zip(axes, ("alpha1", "alpha2"), ("α1 (deviation ratio)", "α2 (deviation alignment)")):
        for lab, g in df.groupby(pd.Series(task, index=df.index)):
            ax.scatter(g[col], 100 * g["gain"], label=lab, s=30)
            for r in g.itertuples():
                text = r.source + (" (linear probe)" if r.finetune == "linear" else "")
                ax.annotate(text, (getattr(r, col), 100 * r.gain), fontsize=6, xytext=(3, 2),
                            textcoords="offset points")
        ax.set_xlabel(name)
        ax.set_ylabel("fine-tuning gain over scratch (points)")
        ax.axhline(0, color="grey", lw=0.6)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.suptitle("Adversarial vs knowledge transferability (one point per source → descendant)", fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(handles, labels, title="downstream task", fontsize=7, title_fontsize=7, loc="lower center",
               ncol=len(labels), frameon=False)
    path = out / "knowledge_transfer.png"
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
