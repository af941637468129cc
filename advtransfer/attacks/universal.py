"""Universal adversarial perturbations (UAPs): one δ (1×C×H×W, pixels) that fools a model on most
images. Shared loop of :mod:`sgd_uap` and :mod:`xtransfer_uap`.

SGD-UAP (algorithm notes): δ = 0; for each minibatch of the crafting images,
loss = mean(min(L(f(clip(x + δ)), y), β)) with β = 12; δ ← clip(δ + α_e·sign(∇_δ loss), −ε, ε),
where α_e = α·decay^epoch. Untargeted: L is the cross-entropy of the true label, ascended.
Targeted: one target class for every image, L its cross-entropy, descended (the clamp at β keeps a
few far-away images from dominating in both cases).

``steps`` counts δ updates (one minibatch each); the crafting images (the first ``n_craft`` of
the *training* split when run by the grid runner) are visited in a seeded shuffled order, epoch
after epoch. The δ is batch-wide by construction (it is one perturbation for all images); there is
no per-sample norm to take. Only L∞ is offered.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..core.errors import UserError
from ..core.metrics import predict_batched
from ..core.schema import CRAFT_FIT_IMAGES
from .base import Attack, CraftContext, Crafted, Objective, Perturbed, SurrogateCall, SurrogateSet, take_extra
from .params import Param


@dataclass(frozen=True)
class CraftedDelta:
    """One universal crafting run: ``delta`` (1×C×H×W, pixels, in [−ε, ε]), ``grad_evals``
    (gradient evaluations per crafting image) and ``info`` (:meth:`UniversalAttack.info`)."""

    delta: torch.Tensor
    grad_evals: int
    info: dict[str, Any]


class UniversalAttack(Attack):
    """Base of universal attacks. Parameters besides eps/steps/alpha/targeted/seed:

    ``n_craft`` (images δ is crafted on; the runner takes training images 0..n_craft-1),
    ``batch`` (images per δ update), ``decay`` (step-size factor per epoch), ``beta`` (loss clamp),
    ``target_class`` (the one target of a targeted UAP).
    """

    norms = ("linf",)
    default_steps = 40
    parameters = {"n_craft": Param(2000, "int", lo=1, within="train_images", doc="training images the perturbation is fitted on"),
                                 "batch": Param(100, "int", lo=1, doc="images a step"),
                                 "decay": Param(0.7, "number", lo=0, lo_open=True, hi=1, doc="step-size decay"),
                                 "beta": Param(12.0, "number", lo=0, lo_open=True, doc="loss clamp β"),
                                 "target_class": Param(0, "class", doc="the one target class (targeted)")}

    def default_alpha(self) -> float:
        return self.eps / 5

    def init_extra(self, **kwargs: Any) -> dict[str, Any]:
        extra = take_extra(self, kwargs)
        extra["decay"], extra["beta"] = float(extra["decay"]), float(extra["beta"])
        extra["target_class"] = int(extra["target_class"])
        if self.target != "random":
            raise UserError(f"attack {self.name!r}: a universal perturbation has one target: set target_class, not target")
        return extra

    def grad_evals_formula(self, n_models: int) -> int:
        """Gradient evaluations per crafting image (each image is visited steps·batch/n_craft times)."""
        return math.ceil(self.steps * min(self.extra["batch"], self.extra["n_craft"]) * n_models / self.extra["n_craft"])

    def craft_passes(self, n_models: int, n_images: int) -> int:
        """steps × batch × models, spent on the crafting images whatever the test images."""
        return self.steps * min(self.extra["batch"], self.extra["n_craft"]) * n_models

    # --- hooks for subclasses -------------------------------------------------------------
    def start(self, S: SurrogateCall) -> Any:
        """The crafting run's own state (a bandit's counts), made once before the first δ update
        and handed to the other hooks; never kept on the attack. None by default."""
        return None

    def members(self, S: SurrogateCall, step: int, state: Any) -> list[int]:
        """Indices of the surrogate-set members whose loss this update uses (all by default)."""
        return list(range(len(S)))

    def after_update(self, S: SurrogateCall, chosen: list[int], before: torch.Tensor, xb: torch.Tensor,
                     yb: torch.Tensor, delta: torch.Tensor, state: Any) -> None:
        """Called after each update with the per-member clamped losses ``before`` (k,) at the old δ."""

    def info(self, state: Any) -> dict[str, Any]:
        """What a crafting run with final ``state`` records besides δ (JSON-able)."""
        return {}

    # --- the loop ----------------------------------------------------------------------------
    def member_losses(self, S: SurrogateCall, x: torch.Tensor, y: torch.Tensor, chosen: list[int]) -> torch.Tensor:
        """Clamped per-member losses min(L_i, β), averaged over the batch: shape (len(chosen),)."""
        out = []
        for i in chosen:
            obj = S.loss(x, y, idx=[i])
            ce = -obj if self.targeted else obj
            out.append(ce.clamp(max=self.extra["beta"]).mean())
        return torch.stack(out)

    def craft_delta(self, S: SurrogateSet | SurrogateCall, x: torch.Tensor, y: torch.Tensor,
                    device: str = "cpu") -> CraftedDelta:
        """Craft δ (1×C×H×W, in [−ε, ε]) on images ``x`` (N×C×H×W in [0,1], on any device) with
        labels ``y`` (the true labels; targeted attacks aim at ``target_class``).

        Returns a :class:`CraftedDelta`: δ, the gradient evaluations spent *per crafting image*,
        and what the run records (:meth:`info`). A surrogate set is bound to this attack's ensemble mode with the
        cross-entropy loss (the loss parameter is not applied to a cell's δ); a call (from
        :meth:`run`) keeps its own objective.
        """
        if isinstance(S, SurrogateSet):
            S = S.bind(Objective(ensemble=self.ensemble, targeted=self.targeted))
        n, bs = len(x), min(self.extra["batch"], len(x))
        goal = torch.full_like(y, self.extra["target_class"]) if self.targeted else y
        gen = torch.Generator().manual_seed(self.seed)
        order = torch.randperm(n, generator=gen)
        delta = torch.zeros(1, *x.shape[1:], device=device)
        total_evals, pos, epoch = 0, 0, 0
        state = self.start(S)
        for step in range(self.steps):
            if pos + bs > n:
                order, pos, epoch = torch.randperm(n, generator=gen), 0, epoch + 1
            sel = order[pos:pos + bs]
            pos += bs
            xb, yb = x[sel].to(device), goal[sel].to(device)
            S.advance()
            chosen = self.members(S, step, state)
            d = delta.clone().requires_grad_(True)
            with torch.enable_grad():
                losses = self.member_losses(S, (xb + d).clamp(0, 1), yb, chosen)
                (g,) = torch.autograd.grad(losses.mean(), d)
            total_evals += bs * sum(S.evals_per_call(i) for i in chosen)
            sign = -1.0 if self.targeted else 1.0
            alpha = self.alpha * self.extra["decay"] ** epoch
            delta = (delta + sign * alpha * g.sign()).clamp(-self.eps, self.eps).detach()
            self.after_update(S, chosen, losses.detach(), xb, yb, delta, state)
        return CraftedDelta(delta, math.ceil(total_evals / n), self.info(state))

    def craft(self, S: SurrogateSet, ctx: CraftContext) -> Crafted:
        """A universal cell: δ crafted on training images 0..n_craft−1 (``ctx.train_data``) and
        applied to the evaluation images, x_adv = clip(x + δ). A targeted UAP has one target class;
        evaluation images of that class are left out (they cannot show a success), so the crafted
        ``index`` is a subset. Cached with the cell: δ (1×C×H×W), the labels of the evaluated images
        and one clean example (for the figure). Row fields: ``universal``, ``n_craft``, the
        surrogate set's fooling rate on up to CRAFT_FIT_IMAGES crafting images, ``bandit_counts`` (X-Transfer)."""
        import json

        if ctx.train_data is None:
            raise UserError(f"attack {self.name!r} crafts on training images; this context has none")
        keep = ctx.y != self.extra["target_class"] if self.targeted else torch.ones(len(ctx.y), dtype=torch.bool)
        x, y, index = ctx.x[keep], ctx.y[keep], ctx.index[keep]
        x_craft, y_craft, _ = ctx.train_data(self.extra["n_craft"])
        t0 = time.perf_counter()
        crafted = self.craft_delta(S, x_craft, y_craft, ctx.device)
        delta = crafted.delta.cpu()
        craft_s = time.perf_counter() - t0
        x_adv = (x + delta).clamp(0, 1)
        target = torch.full_like(y, self.extra["target_class"]) if self.targeted else None
        xs, ys = x_craft[:CRAFT_FIT_IMAGES], y_craft[:CRAFT_FIT_IMAGES]  # how well δ fits the crafting images
        pc = predict_batched(S.predict, xs, ctx.batch_size, ctx.device)
        pa = predict_batched(S.predict, (xs + delta).clamp(0, 1), ctx.batch_size, ctx.device)
        ok = pc == ys
        info = crafted.info
        fields = {"universal": True, "n_craft": len(x_craft),
                  "craft_fooling_rate": float(((pa != ys) & ok).sum() / ok.sum().clamp_min(1)),
                  "bandit_counts": json.dumps(info["bandit_counts"], sort_keys=True) if "bandit_counts" in info else None}
        if ctx.progress is not None:
            ctx.progress(len(ctx.x))
        return Crafted(x_adv, index, target, int(crafted.grad_evals), craft_s,
                       tensors={"delta": delta, "y": y, "x_example": x[:1]}, fields=fields)

    def perturb(self, S: SurrogateCall, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> Perturbed:
        """Called as a plain attack: crafts δ on these very images and returns clip(x + δ), with
        δ (1×C×H×W) and the run's info in ``extras`` (``delta``, ``info``) and the gradient
        evaluations per image.

        ``y`` holds true labels (targeted: the target class is ``target_class``, not y)."""
        crafted = self.craft_delta(S, x, y, str(x.device))
        return Perturbed((x + crafted.delta).clamp(0, 1), crafted.grad_evals,
                         {"delta": crafted.delta, "info": crafted.info})
