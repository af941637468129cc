"""Transfer-matrix heatmaps: one figure per (attack label, ε, norm, targeted) of a run.

Rows are surrogates (sets included), columns victims grouped by family; each cell shows ASR in
percent (averaged over seeds), on a fixed 0–100 colour scale; white-box cells are outlined.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

FAMILY_ORDER = ["cnn", "mobile", "dense", "vit", "clip", "timm", "defended"]


def slug(s: str) -> str:
    """``s`` as a file-name stem: every run of characters outside [A-Za-z0-9_.-] becomes one '-'."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", s).strip("-")


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (figures are only ever written to
    files): the one place the harness selects a backend; every module that draws calls this."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, out_dir: str | Path, stem: str, formats: tuple[str, ...] = ("png", "pdf"), dpi: int = 150,
                tight: bool = False) -> list[Path]:
    """Save a matplotlib figure as ``out_dir/<slug(stem)>.<fmt>`` for each format, close it, and
    return the paths (the one way every figure of the harness is written). ``tight``: crop to
    every artist, labels and legends outside the axes included."""
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = out_dir / f"{slug(stem)}.{fmt}"
        fig.savefig(path, dpi=dpi, bbox_inches="tight" if tight else None)
        paths.append(path)
    plt.close(fig)
    return paths


def transfer_matrix(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[tuple[str, str]]]:
    """ASR matrix (percent, surrogates × victims), white-box mask and (victim, family) order."""
    fam = df.groupby("victim")["victim_family"].first()
    victims = sorted(fam.index, key=lambda v: (FAMILY_ORDER.index(fam[v]) if fam[v] in FAMILY_ORDER
                                               else len(FAMILY_ORDER), fam[v], v))
    surrogates = list(dict.fromkeys(df.sort_values(["n_surrogates", "surrogate"])["surrogate"]))
    asr = df.groupby(["surrogate", "victim"])["asr"].mean().unstack("victim") * 100
    wb = df.groupby(["surrogate", "victim"])["is_whitebox"].any().unstack("victim")
    asr = asr.reindex(index=surrogates, columns=victims)
    wb = wb.reindex(index=surrogates, columns=victims).fillna(False).astype(bool)
    return asr, wb, [(v, fam[v]) for v in victims]


def plot_run(run_dir: str | Path, formats: tuple[str, ...] = ("png", "pdf")) -> list[Path]:
    """Write the heatmaps of ``RUN_DIR/results.parquet`` to ``RUN_DIR/figures/``; returns the paths."""
    from ..run.store import RunStore

    run_dir = Path(run_dir)
    df = RunStore(run_dir).read_results()
    return plot_matrices(df, run_dir / "figures", formats) + plot_uaps(run_dir, df) + plot_gen_curves(run_dir, df)


def gen_curves(df) -> list[tuple[Any, list[list[float]]]]:
    """The generative cells of a results table that drew a held-out curve: (the cell's first row,
    its curve as ``[[updates, surrogate passes, held-out fooling rate], ...]``), by attack label,
    surrogate, ε and seed."""
    if "gen_curve" not in df.columns:
        return []
    sel = df[df["gen_curve"].fillna("").astype(str).str.startswith("[")]
    keys = [k for k in ("cell_id",) if k in sel.columns] or ["attack_label", "surrogate", "eps_str", "seed"]
    cells = sel.drop_duplicates(keys).sort_values(["attack_label", "surrogate", "eps", "seed"], kind="stable")
    return [(r, json.loads(r["gen_curve"])) for _, r in cells.iterrows()]


def plot_gen_curves(run_dir: str | Path, df, formats: tuple[str, ...] = ("png",)) -> list[Path]:
    """One figure per (attack label, ε) of a run with held-out generator curves: the surrogate
    set's fooling rate (targeted: target hit rate) on the held-out training images against
    optimiser updates, one line per surrogate and seed, the plateau rule's point marked (○) and the
    last update (where training stopped) at the line's end; a second axis of surrogate passes
    (millions) along the top."""
    curves = gen_curves(df)
    if not curves:
        return []
    plt = pyplot()
    written: list[Path] = []
    groups: dict[tuple[str, str], list] = {}
    for r, c in curves:
        groups.setdefault((str(r["attack_label"]), str(r["eps_str"])), []).append((r, c))
    for (label, eps_str), items in groups.items():
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        per_update = None
        for r, c in items:
            u = [p[0] for p in c]
            rate = [100 * p[2] for p in c]
            name = str(r["surrogate"]) + (f" seed {int(r['seed'])}" if len({int(i['seed']) for i, _ in items}) > 1 else "")
            line, = ax.plot(u, rate, marker=".", markersize=3, linewidth=1.2, label=name)
            at = r.get("gen_plateau_at")
            if at is not None and not pd.isna(at) and int(at) in u:
                k = u.index(int(at))
                ax.plot([u[k]], [rate[k]], marker="o", markersize=8, fillstyle="none", color=line.get_color())
            if len(c) > 1 and c[-1][0] > 0:
                per_update = c[-1][1] / c[-1][0]
        ax.set_xlabel("generator updates")
        ax.set_ylabel("held-out fooling rate % (surrogate set)" if not bool(items[0][0]["targeted"])
                      else "held-out target hit rate % (surrogate set)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        if per_update:
            top = ax.secondary_xaxis("top", functions=(lambda x, k=per_update: x * k / 1e6,
                                                       lambda m, k=per_update: m * 1e6 / k))
            top.set_xlabel("surrogate passes (millions)", fontsize=8)
            top.tick_params(labelsize=7)
        r0 = items[0][0]
        n_held = int(json.loads(r0["attack_params"]).get("curve_n", 0)) if "attack_params" in r0 else 0
        ax.set_title(f"{label} at {eps_str}: held-out curve on {n_held:,} training images after the first "
                     f"{int(r0['n_craft']):,} (○ where it flattened)", fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        written += save_figure(fig, Path(run_dir) / "figures", f"gen_curve_{label}_eps{eps_str.replace('/', '-')}",
                               formats)
    return written


def plot_matrices(df: pd.DataFrame, out_dir: str | Path, formats: tuple[str, ...] = ("png", "pdf")) -> list[Path]:
    """One transfer-matrix heatmap (ASR %, surrogates × victims grouped by family, white-box cells
    outlined) per (attack label, ε, norm, targeting) of a results table, into ``out_dir`` as
    ``transfer_<label>_<norm>_eps<a>-<b>[_targeted].<format>``; returns the paths."""
    from matplotlib.patches import Rectangle

    plt = pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    keys = ["attack_label", "eps", "norm", "targeted"]
    for (label, eps, norm, targeted), sub in df.groupby(keys, sort=True):
        asr, wb, order = transfer_matrix(sub)
        nr, nc = asr.shape
        fig, ax = plt.subplots(figsize=(max(6.0, 1.6 + 0.85 * nc), 1.4 + 0.55 * nr + 0.6))
        im = ax.imshow(asr.to_numpy(dtype=float), cmap="viridis", vmin=0, vmax=100, aspect="auto")
        for i in range(nr):
            for j in range(nc):
                v = asr.iat[i, j]
                if pd.notna(v):
                    ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=8,
                            color="black" if v > 60 else "white")
                if wb.iat[i, j]:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", lw=2))
        ax.set_xticks(range(nc), [v for v, _ in order], rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(nr), list(asr.index), fontsize=8)
        # family bands along the top
        fams = [f for _, f in order]
        start = 0
        for j in range(1, nc + 1):
            if j == nc or fams[j] != fams[start]:
                ax.annotate(fams[start], xy=((start + j - 1) / 2, -0.5), xytext=(0, 4),
                            textcoords="offset points", ha="center", va="bottom", fontsize=8, style="italic")
                if j < nc:
                    ax.axvline(j - 0.5, color="white", lw=2)
                start = j
        eps_str = sub["eps_str"].iloc[0]
        n = int(sub["n"].iloc[0])
        title = f"{label} · {norm} ε={eps_str}{' · targeted' if targeted else ''} · ASR % (n={n})"
        ax.set_title(title, fontsize=9, pad=16)
        ax.set_xlabel("victim (grouped by family; red box = white-box)", fontsize=8)
        ax.set_ylabel("surrogate", fontsize=8)
        cb = fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
        cb.set_label("ASR (%)", fontsize=8)
        fig.tight_layout()
        written += save_figure(fig, out_dir, f"transfer_{label}_{norm}_eps{eps_str.replace('/', '-')}"
                                             f"{'_targeted' if targeted else ''}", formats)
    return written


def plot_uaps(run_dir: str | Path, df, formats: tuple[str, ...] = ("png",)) -> list[Path]:
    """One figure per universal cell of a run: δ amplified to the full range (grey = 0), a test
    image before and after, and (X-Transfer) how often the bandit used each surrogate."""
    from ..data import CIFAR10_CLASSES
    from ..run.store import RunStore

    if "universal" not in df.columns:
        return []
    plt = pyplot()
    store = RunStore(run_dir)
    out_dir = Path(run_dir) / "figures"
    written = []
    for cell_id, sub in df[df["universal"].astype(bool)].groupby("cell_id", sort=True):
        loaded = store.load_adv(cell_id)
        if loaded is None or "delta" not in loaded[0]:
            continue
        t, meta = loaded
        r = sub.iloc[0]
        delta, x_adv = t["delta"][0], t["x_adv"]
        eps = float(r["eps"])
        x0 = t["x_example"][0] if "x_example" in t else (x_adv[0] - delta).clamp(0, 1)
        counts = json.loads(r["bandit_counts"]) if r.get("bandit_counts") else None
        ncol = 4 if counts else 3
        fig, axes = plt.subplots(1, ncol, figsize=(2.6 * ncol, 2.9))
        amp = (delta / (2 * eps) + 0.5).clamp(0, 1)
        axes[0].imshow(amp.permute(1, 2, 0).numpy())
        axes[0].set_title(f"δ ×{1 / (2 * eps):.0f} (±{r['eps_str']})", fontsize=8)
        label = int(t["y"][0]) if "y" in t else None
        name = CIFAR10_CLASSES[label] if label is not None and r["dataset"] == "cifar10" else ""
        axes[1].imshow(x0.permute(1, 2, 0).numpy())
        axes[1].set_title(f"test #{int(t['index'][0])} {name}", fontsize=8)
        axes[2].imshow(x_adv[0].permute(1, 2, 0).numpy())
        victims = sub.sort_values("victim")
        fr = [f"{v}:{a * 100:.0f}" for v, a in zip(victims["victim"], victims["asr"])]
        fr = ", ".join(fr[:6]) + ("\n" + ", ".join(fr[6:]) if len(fr) > 6 else "")
        axes[2].set_title("x + δ", fontsize=8)
        for ax in axes[:3]:
            ax.axis("off")
        if counts:
            axes[3].barh(list(counts), list(counts.values()), color="tab:blue")
            axes[3].set_title("bandit: updates per surrogate", fontsize=8)
            axes[3].tick_params(labelsize=7)
        kind = "targeted→" + str(int(json.loads(r["attack_params"])["target_class"])) if bool(r["targeted"]) else "untargeted"
        fig.suptitle(f"{r['attack_label']} · {r['surrogate']} · {kind} · crafted on {int(r['n_craft'])} train images\n"
                     f"ASR %: {fr}", fontsize=7)
        fig.tight_layout()
        stem = slug(f"uap_{r['attack_label']}_{r['surrogate']}_eps{r['eps_str'].replace('/', '-')}"
                     f"{'_targeted' if bool(r['targeted']) else ''}")
        for fmt in formats:
            path = out_dir / f"{stem}.{fmt}"
            fig.savefig(path, dpi=150)
            written.append(path)
        plt.close(fig)
    return written
