"""DVERGE (Yang et al., 2020): diversifying the vulnerabilities of an ensemble's members.

For a batch of source images x_s (labels y_s) and randomly paired target images x_t, each member
m distils its non-robust features of x_t into x_s:
    x'_m = argmin_{‖x' − x_s‖∞ ≤ ε} ‖h_m^l(x') − h_m^l(x_t)‖²
(h_m^l: member m's features at layer l, drawn uniformly among its blocks at the start of each
epoch), and each member i then learns to label the other members' distilled images with the
*source* labels: L_i = Σ_{j≠i} CE(f_i(x'_j), y_s) (round-robin cross-training; no clean term,
as in the authors' default). The authors start from trained members (``init_from`` a plainly
trained ensemble here) and distil with ε = 0.07, step 0.007, 10 steps of signed gradients with
momentum on L1-normalised gradients, no random start; those are the defaults.

Simplification, stated: targets are a random permutation of the same batch (the authors draw
them from an independent pass over the training set: the same distribution); the distillation
layer is drawn among the member's main-chain blocks (for a ResNet-20 its nine residual blocks;
the authors index the stem conv as well).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data import Split
from ..core.errors import UserError
from ..core.utils import parse_fraction
from .base import TrainOutput, register_method
from .context import TrainingContext
from .resume import ResumeHooks
from .standard import fit


def _members(net: nn.Module) -> list[nn.Module]:
    inner = getattr(net, "net", net)
    subnets = getattr(inner, "subnets", None)
    if subnets is None or len(subnets) < 2:
        raise UserError("dverge trains an ensemble entry (arch: ensemble, members >= 2)")
    return list(subnets)


def distill(member: nn.Module, layer: nn.Module, norm, x_s: torch.Tensor, x_t: torch.Tensor, eps: float,
            alpha: float, steps: int) -> torch.Tensor:
    """Member's features of ``x_t`` at ``layer`` distilled into ``x_s`` within the L∞ ε-ball
    (pixels in [0,1]); ``norm`` maps pixels to the member's input. Signed-gradient descent with
    momentum 1 on per-sample L1-normalised gradients, as in the authors' code."""
    feats: list[torch.Tensor] = []
    handle = layer.register_forward_hook(lambda _m, _i, out: feats.append(out))  # returns None
    was = member.training
    member.eval()
    try:
        with torch.no_grad():
            member(norm(x_t))
            target = feats.pop().detach()
        x = x_s.clone()
        g_acc = torch.zeros_like(x)
        for _ in range(steps):
            x.requires_grad_(True)
            member(norm(x))
            loss = F.mse_loss(feats.pop(), target, reduction="sum")
            (g,) = torch.autograd.grad(loss, x)
            g = g / g.abs().flatten(1).sum(1).clamp_min(1e-12).view(-1, 1, 1, 1)
            g_acc = g_acc + g
            x = torch.min(torch.max(x.detach() - alpha * g_acc.sign(), x_s - eps), x_s + eps).clamp(0, 1)
    finally:
        handle.remove()
        member.train(was)
    return x.detach()


@register_method("dverge", version=1)
def train_dverge(net: nn.Module, recipe: dict, data: Split, ctx: TrainingContext) -> TrainOutput:
    """DVERGE on an ensemble entry: ``distill_eps`` (0.07), ``distill_alpha`` (0.007),
    ``distill_steps`` (10), ``distill_layer`` (a block index to fix it; default: drawn per epoch)."""
    from ..attacks.features import candidate_layers

    members = _members(net)
    eps = parse_fraction(recipe.get("distill_eps", 0.07))
    alpha = parse_fraction(recipe.get("distill_alpha", 0.007))
    steps = int(recipe.get("distill_steps", 10))
    if steps < 1 or eps <= 0 or alpha <= 0:
        raise UserError("distill_steps must be >= 1 and distill_eps, distill_alpha > 0")
    blocks = [[dict(m.named_modules())[n] for n in candidate_layers(m)] for m in members]
    if any(not b for b in blocks):
        raise UserError("dverge: a member has no block chain to distil features from")
    fixed = recipe.get("distill_layer")
    gen = torch.Generator().manual_seed(int(recipe.get("seed", 0)) + 17)
    state = {"layer": 0}
    layers_used: list[int] = []

    def pick_layer() -> None:
        n = len(blocks[0])
        state["layer"] = int(fixed) % n if fixed is not None else int(torch.randint(0, n, (1,), generator=gen))
        layers_used.append(state["layer"])

    pick_layer()

    def norm(x: torch.Tensor) -> torch.Tensor:
        z = (x - net.mean) / net.std
        return z.contiguous(memory_format=torch.channels_last) if getattr(net, "channels_last", False) else z

    def backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, ls: float) -> torch.Tensor:
        perm = torch.randperm(len(x), generator=gen).to(x.device)
        x_t = x[perm]
        distilled = [distill(m, blocks[i][min(state["layer"], len(blocks[i]) - 1)], norm, x, x_t, eps, alpha, steps)
                     for i, m in enumerate(members)]
        loss = x.new_zeros(())
        for i, m in enumerate(members):
            for j, xd in enumerate(distilled):
                if j != i:
                    loss = loss + F.cross_entropy(m(norm(xd)), y, label_smoothing=ls)
        loss.backward()
        return loss / (len(members) * (len(members) - 1))

    def on_epoch_end(epoch: int, _net: nn.Module) -> None:
        pick_layer()

    def get_state() -> dict:
        return {"gen": gen.get_state(), "layer": state["layer"], "layers_used": list(layers_used)}

    def set_state(saved: dict) -> None:
        gen.set_state(saved["gen"])
        state["layer"] = int(saved["layer"])
        layers_used[:] = [int(v) for v in saved["layers_used"]]

    # resumable: the pairings and the next epoch's layer come from ``gen``, saved after each epoch
    # (after on_epoch_end has drawn the next layer) with the loop's state
    out = fit(net, recipe, data, ctx, backward=backward, on_epoch_end=on_epoch_end,
              resume_hooks=ResumeHooks(get_state, set_state))
    out.meta.update(distill_eps=eps, distill_alpha=alpha, distill_steps=steps, layers_used=layers_used[:-1])
    out.meta["surrogate_params"] = {"epochs": int(recipe["epochs"]), "distill_eps": eps, "members": len(members)}
    return out
