"""PDCL-Attack (Yang et al., ECCV 2024): the BIA generator (mid-layer feature loss) guided by CLIP's
text features of the images' ground-truth classes.

Phase 1 (prompt learning, CoOp-style): M context vectors (token embeddings, ``n_ctx``) are learned
so that the prompts [ctx_1 … ctx_M][class name] classify the training images with the frozen CLIP:
cross-entropy of logit_scale·cos(φ(x), τ_c) over the classes, Adam, ``prompt_steps`` updates.
Phase 2 (generator training): with φ = CLIP image embedding and τ_c the learned prompts' text
embeddings, L = L_BIA + λ·[cos(φ(x_adv), τ_y) − cos(φ(x_adv), τ_ŷ)], where ŷ is the class whose
text is *least* similar to the clean image's embedding φ(x): the adversarial image is pushed away
from its true class's text and pulled toward the least similar one. Inference is the plain generator.

The CLIP model is a zoo entry (``clip``: an open_clip model with its text tower, e.g.
``clip_vit_b32`` for users with its weights). Offline the path runs with a tiny open_clip
configuration at random initialisation (tests only: such a model gives no meaningful number).
CLIP passes are not surrogate passes: they are recorded separately (``aux_passes``: image-passes
through the CLIP image tower during phase 2, forward+backward).

What is simplified (the paper's code is not public; its project page gives the structure): the
guidance loss as the difference of cosine similarities (no temperature), λ = 1, M = 4 context
vectors initialised from "a photo of a", and the prompt-learning budget are this harness's choices,
all parameters.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core.errors import UserError
from .base import CraftContext, register_attack
from .params import Param
from .generative import GenerativeAttack, TrainState


@register_attack("pdcl", kind="generative", version=2)
class PDCL(GenerativeAttack):
    """BIA + prompt-driven contrastive guidance. Parameters besides the generator's: ``clip`` (zoo
    entry of the CLIP model; required), ``n_ctx`` (learned context vectors), ``prompt_steps`` and
    ``prompt_lr`` (phase 1), ``pdcl_weight`` (λ)."""

    default_objective = "feature"
    parameters = {**GenerativeAttack.parameters, "clip": Param("", "model", doc="an open_clip zoo entry with its text tower"),
                                 "n_ctx": Param(4, "int", lo=1, doc="prompt context tokens"),
                                 "prompt_steps": Param(100, "int", lo=1, doc="prompt-learning steps"),
                                 "prompt_lr": Param(2e-3, "number", lo=0, lo_open=True, doc="prompt learning rate"),
                                 "pdcl_weight": Param(1.0, "number", lo=0, doc="weight of the prompt term")}

    def init_extra(self, **kwargs: Any) -> dict[str, Any]:
        if self.targeted:
            raise UserError(f"attack {self.name!r} is untargeted (guided away from the true class); drop targeted: true")
        extra = super().init_extra(**kwargs)
        if extra["objective"] != "feature":
            raise UserError(f"attack {self.name!r}: PDCL builds on BIA's feature loss; objective must be feature")
        if not extra["clip"]:
            raise UserError(f"attack {self.name!r} needs clip: <zoo entry of an open_clip model with its text tower>, "
                            f"e.g. clip_vit_b32")
        extra["prompt_lr"], extra["pdcl_weight"] = float(extra["prompt_lr"]), float(extra["pdcl_weight"])
        return extra

    def condition_table(self, ctx: CraftContext | None):
        clip = self.clip(ctx)
        if not getattr(clip, "has_text", False):
            raise UserError(f"attack {self.name!r}: model {self.extra['clip']!r} has no CLIP text tower "
                            f"(PDCL learns prompts): use an open_clip zoo entry")
        return None, {"clip": clip}

    def start(self, st: TrainState) -> None:
        """Phase 1: learn the prompt context on the training images, then fix the class texts."""
        clip = st.aux["clip"]
        x, y = st.train_x, st.train_y
        ctx = nn.Parameter(clip.context_init(int(self.extra["n_ctx"])).to(x.dtype))
        opt = torch.optim.Adam([ctx], lr=self.extra["prompt_lr"])
        bs = min(self.extra["batch"], len(x))
        with torch.no_grad():
            feats = torch.cat([clip.encode_image(x[s:s + 256].to(st.device)).to(x.dtype) for s in range(0, len(x), 256)])
        scale = float(getattr(clip, "logit_scale", 100.0))
        prompt_losses: list[float] = []  # phase 1's cross-entropy per update
        for k in range(int(self.extra["prompt_steps"])):
            sel = torch.randint(0, len(x), (bs,), generator=st.gen)
            with torch.enable_grad():
                tau = clip.prompt_text_features(ctx)
                logits = scale * feats[sel] @ tau.T
                loss = F.cross_entropy(logits, y[sel].to(logits.device))
                (g,) = torch.autograd.grad(loss, ctx)
            prompt_losses.append(float(loss.detach()))
            ctx.grad = g
            opt.step()
        with torch.no_grad():
            st.prompt_text = clip.prompt_text_features(ctx).detach()
            acc = float(((feats @ st.prompt_text.T).argmax(1).cpu() == y.cpu()).double().mean())
        st.info.update(prompt_losses=prompt_losses, prompt_train_acc=acc)
        st.aux_passes = 0

    def train_loss(self, st, x, x_adv, y, t):
        loss = self.base_loss(st, x, x_adv, y, t)
        lam = float(self.extra["pdcl_weight"])
        if lam == 0:
            return loss
        clip = st.aux["clip"]
        tau = st.prompt_text.to(x_adv)
        with torch.no_grad():
            least = (clip.encode_image(x).to(x.dtype) @ tau.T).argmin(1)
        phi = clip.encode_image(x_adv).to(x_adv.dtype)
        guide = (phi * tau[y]).sum(1) - (phi * tau[least]).sum(1)
        st.aux_passes += len(x)
        return loss + lam * guide.mean()
