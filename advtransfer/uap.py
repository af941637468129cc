"""Universal perturbations in a grid: craft δ on training images, apply it to the test subset,
draw it. Pure crafting (:func:`craft_universal`) plus the figure (:func:`plot_uaps`).

A universal cell crafts one δ (1×C×H×W, pixels, ‖δ‖∞ ≤ ε) on the *training* split, images
0..n_craft-1, and evaluates x_adv = clip(x_test + δ) on the grid's test subset. A targeted UAP has
one target class; test images of that class are left out of its evaluation (they cannot show a
success), so its rows have a smaller ``n``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from .attacks.base import SurrogateSet
from .attacks.universal import UniversalAttack
from .cell import CraftResult


def universal_eval_subset(attack: UniversalAttack, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The test images a universal cell is evaluated on (targeted: those not of the target class)."""
    if not attack.targeted:
        return x, y, index
    keep = y != attack.extra["target_class"]
    return x[keep], y[keep], index[keep]


@torch.no_grad()
def _set_predict(S: SurrogateSet, x: torch.Tensor, batch_size: int, device: str) -> torch.Tensor:
    return torch.cat([S.predict(x[s:s + batch_size].to(device)).cpu() for s in range(0, len(x), batch_size)])


def craft_universal(attack: UniversalAttack, S: SurrogateSet, x_craft: torch.Tensor, y_craft: torch.Tensor,
                    x: torch.Tensor, y: torch.Tensor, index: torch.Tensor, batch_size: int = 250,
                    device: str = "cpu") -> tuple[CraftResult, torch.Tensor, dict]:
    """Craft δ on (x_craft, y_craft) and apply it to the evaluation images (x, y, index).

    Returns (craft result on the evaluation images, δ 1×C×H×W on the CPU, info dict with
    ``n_craft``, ``grad_evals_total``, the surrogate set's fooling rate on the crafting images and
    the attack's own records such as ``bandit_counts``).
    """
    t0 = time.perf_counter()
    delta = attack.craft_delta(S, x_craft, y_craft, device).cpu()
    craft_s = time.perf_counter() - t0
    x_adv = (x + delta).clamp(0, 1)
    target = torch.full_like(y, attack.extra["target_class"]) if attack.targeted else None
    sur_ok = _set_predict(S, x, batch_size, device) == y
    xs, ys = x_craft[:500], y_craft[:500]  # a check of the crafting fit, on up to 500 crafting images
    pc, pa = _set_predict(S, xs, batch_size, device), _set_predict(S, (xs + delta).clamp(0, 1), batch_size, device)
    ok = pc == ys
    info = {"n_craft": len(x_craft), "grad_evals_total": int(S.grad_evals * len(x_craft)),
            "craft_fooling_rate_first500": float(((pa != ys) & ok).sum() / ok.sum().clamp_min(1)),
            **attack.info()}
    res = CraftResult(x_adv, index, target, int(S.grad_evals), craft_s, sur_ok, info)
    return res, delta, info


def plot_uaps(run_dir: str | Path, df, formats: tuple[str, ...] = ("png",)) -> list[Path]:
    """One figure per universal cell of a run: δ amplified to the full range (grey = 0), a test
    image before and after, and (X-Transfer) how often the bandit used each surrogate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .data import CIFAR10_CLASSES
    from .plots import _slug
    from .store import RunStore

    if "universal" not in df.columns:
        return []
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
        counts = (meta.get("info") or {}).get("bandit_counts")
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
        stem = _slug(f"uap_{r['attack_label']}_{r['surrogate']}_eps{r['eps_str'].replace('/', '-')}"
                     f"{'_targeted' if bool(r['targeted']) else ''}")
        for fmt in formats:
            path = out_dir / f"{stem}.{fmt}"
            fig.savefig(path, dpi=150)
            written.append(path)
        plt.close(fig)
    return written
