"""The generative attack kind: a perturbation generator trained on the cell's surrogate set, then
applied to the test images in one forward pass each. Shared training loop of :mod:`cda`, :mod:`bia`,
:mod:`facl`, :mod:`pdcl`, :mod:`cgnc` and :mod:`dual_flow`.

Crafting a cell (:meth:`GenerativeAttack.craft`):

1. the generator (:mod:`advtransfer.attacks.generators`) is initialised from the attack's seed and
   trained for ``steps`` Adam updates on minibatches of ``batch`` training images (the first
   ``n_craft`` of the grid's training split, visited in a seeded shuffled order, epoch after
   epoch). Each update forwards the batch through the generator, x_adv = clip(x + δ, 0, 1) with δ
   bounded by ε in the cell's norm by construction (:func:`~advtransfer.attacks.generators.bound`),
   and descends the attack's loss on the surrogate set;
2. the trained generator (eval mode: batch norm uses its running statistics, so an image's
   perturbation does not depend on its batch) perturbs the test images.

The generator's weights are cached with the cell's examples (tensors ``gen.*``). ``grad_evals``
counts, *per training image*, the surrogate forward+backward passes of the training (a batch of
B images through a model costs B image-passes; spread over the ``n_craft`` images); applying the
generator costs no surrogate pass. ``craft_s`` is the wall time of training plus application.

Conditional (multi-target) attacks (``conditional = True``) are targeted: one generator for all
classes, conditioned on the target. During training every image gets a target drawn uniformly
among the classes other than its label (seeded per update); at test time the grid's targets
(``target: random``, seeded per image, or one class). The condition vector of class c is
``cond: label`` — a learned embedding of c (64 numbers), trained with the generator — or ``cond:
clip`` — the CLIP text embedding of c's class name (the zero-shot head of the zoo entry named by
``clip``, built from the name in prompt templates), fixed.
"""
from __future__ import annotations

import json
import math
import time
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core.errors import UserError
from ..core.schema import CRAFT_FIT_IMAGES
from .base import Attack, CraftContext, Crafted, Perturbed, SurrogateCall, SurrogateSet, take_extra
from .params import Param
from .features import SPECIAL_LAYERS, check_plain, taps
from .generators import ConditionalResnetGenerator, ResnetGenerator, bound, count_params, project_image

#: generator losses (``objective``): ``feature`` — cosine similarity of the surrogate's features at
#: ``layer`` between x_adv and x, minimised (BIA, Zhang et al. 2022); ``rce`` — relativistic
#: cross-entropy CE(f(x_adv) − f(x), argmax f(x)), maximised (CDA, Naseer et al. 2019); ``ce`` —
#: cross-entropy of the label (targeted: of the target, minimised); ``logit`` — the target's logit,
#: maximised (targeted only)
OBJECTIVES = ("feature", "rce", "ce", "logit")
CONDS = ("label", "clip")
#: when training stops (``stop``): ``budget`` after ``steps`` updates; ``plateau`` once the held-out
#: fooling rate has not risen by ``plateau_gain`` over its best for ``patience`` curve points in a
#: row (``steps`` is then the cap), see :func:`plateau`
STOPS = ("budget", "plateau")
#: what the generator's output is: the perturbation (bounded by construction) or an image projected onto the ball
OUTPUTS = ("delta", "image")


def perturbation_stats(delta: torch.Tensor, eps: float, norm: str) -> tuple[float, float]:
    """How perturbations ``delta`` (N×C×H×W, x_adv − x with pixels in [0,1]) use the ε budget: (the
    share at the bound — L∞: entries with |δ| ≥ 0.99ε, L2: images with ‖δ‖ ≥ 0.99ε —, the share of
    their energy in the image-independent part, N‖mean δ‖² / Σ‖δ_i‖²: 1 when every image gets the
    same δ; about 1/N for unrelated ones; nan when δ is zero)."""
    d = delta.flatten(1).double()
    if norm == "linf":
        at_bound = float((d.abs() >= 0.99 * eps).double().mean())
    else:
        at_bound = float((d.norm(dim=1) >= 0.99 * eps).double().mean())
    energy = float((d ** 2).sum())
    universal = float(len(d) * (d.mean(0) ** 2).sum() / energy) if energy > 0 else float("nan")
    return at_bound, universal


class Conditioned(nn.Module):
    """A conditional network with its class embedding: learned (``table`` None, ``dim`` numbers per
    class) or fixed (``table``: classes×D, e.g. CLIP text embeddings)."""

    def __init__(self, net: nn.Module, n_classes: int, dim: int, table: torch.Tensor | None = None) -> None:
        super().__init__()
        self.net = net
        if table is None:
            self.embed = nn.Embedding(n_classes, dim)
        else:
            self.register_buffer("table", table.detach().clone().float())

    def cond(self, t: torch.Tensor) -> torch.Tensor:
        return self.embed(t) if hasattr(self, "embed") else self.table[t]

    def forward(self, x: torch.Tensor, t: torch.Tensor, **kw: Any) -> torch.Tensor:
        return self.net(x, self.cond(t).to(x.dtype), **kw)


class GenerativeAttack(Attack):
    """Base of generator attacks. Parameters besides eps/norm/steps/targeted/seed:

    ``n_craft`` (training images), ``batch`` (images per update), ``lr`` (Adam step size, default
    2e-4 with β = (0.5, 0.999), CDA's and BIA's optimiser; on the cpu-size resnet20_a, CDA with 600
    updates fooled it on 42% of test images 0..499 at 2e-4, 32% at 1e-3, 13% at 3e-3),
    ``width``/``blocks`` (generator size), ``objective`` (see :data:`OBJECTIVES`), ``layer``
    (surrogate layer of the feature objective: a module name or ``auto``, the middle block), and
    for conditional attacks ``cond`` (``label`` or ``clip``) and ``clip`` (zoo entry of the CLIP
    model), ``output`` (``delta``: δ = bound(G(x)); ``image``: G(x) read as an image and projected
    onto the ε-ball, CDA's code), and the held-out curve's ``curve_every``, ``curve_n``, ``stop``,
    ``patience``, ``plateau_gain``. ``steps`` counts generator updates; ``alpha`` is unused.
    """

    kind = "generative"
    hooks_model = True  # trained on the eager surrogates (feature objectives hook into layers)
    norms = ("linf", "l2")
    default_steps = 600
    conditional = False
    default_objective = "feature"
    #: sized for 2 CPU cores (a cell on one ResNet-20 trains in a few minutes): width 16, 2 residual
    #: blocks (~0.2M parameters), 600 updates of 32 of 5,000 training images; the papers' generator
    #: is width 64 with 6 blocks (README: full-size recipe)
    parameters = {"n_craft": Param(5000, "int", lo=1, within="train_images", doc="training images the generator learns on"),
                                 "batch": Param(32, "int", lo=1, doc="images an update"),
                                 "lr": Param(2e-4, "number", lo=0, lo_open=True, doc="Adam learning rate"),
                                 "width": Param(16, "int", lo=1, doc="generator channels"),
                                 "blocks": Param(2, "int", lo=1, doc="residual blocks of the generator"),
                                 "objective": Param("", "choice", choices=("", *OBJECTIVES), doc="training loss ('': the attack's default)"),
                                 "layer": Param("auto", "layer", choices=SPECIAL_LAYERS, doc="the feature objective's layer"),
                                 "curve_every": Param(0, "int", lo=0, doc="updates between measurements of the held-out fooling rate (0: no curve)"),
                                 "curve_n": Param(1000, "int", lo=1, doc="held-out training images of the curve: those after the first n_craft"),
                                 "stop": Param("budget", "choice", choices=STOPS, doc="budget: train for steps updates; plateau: stop earlier once the curve has flattened"),
                                 "patience": Param(4, "int", lo=1, doc="plateau: curve points in a row without a gain that stop the training"),
                                 "plateau_gain": Param(0.01, "number", lo=0, doc="plateau: the least rise of the held-out fooling rate over its best so far that counts as a gain (0.01: one point)"),
                                 "output": Param("delta", "choice", choices=OUTPUTS, doc="delta: the generator's output r gives the perturbation eps*tanh(r); image: it gives an image (tanh(r)+1)/2 projected onto the eps-ball around x (CDA's train.py)")}
    #: parameters of the held-out curve, recorded (and in the cell id) only when a curve is drawn
    CURVE_KEYS = ("curve_every", "curve_n", "stop", "patience", "plateau_gain")

    def uses(self, key: str) -> bool:
        """``layer`` is read only by the feature objective, the curve's parameters only with a curve."""
        if key in self.CURVE_KEYS and key != "curve_every":
            return bool(self.extra["curve_every"])
        return key != "layer" or self.extra["objective"] == "feature"

    def params(self) -> dict[str, Any]:
        """As :meth:`Attack.params`, without the curve's parameters when no curve is drawn (so the
        cells of runs made before the curve existed keep their ids)."""
        out = super().params()
        if not self.extra["curve_every"]:
            for k in self.CURVE_KEYS:
                out.pop(k, None)
        if out.get("output") == "delta":
            out.pop("output")  # recorded only when not the default, so earlier cells keep their ids
        return out

    def check(self, cell: Any) -> None:
        """The declared checks, and that the curve's held-out images fit the training split
        after the n_craft the generator learns on."""
        super().check(cell)
        n_train = getattr(cell, "n_train", None)
        need = self.extra["n_craft"] + self.extra["curve_n"]
        if self.extra["curve_every"] and n_train is not None and need > n_train:
            raise UserError(f"attack {self.name!r}: n_craft {self.extra['n_craft']} + curve_n {self.extra['curve_n']} "
                            f"held-out images = {need} exceed the {n_train} training images; lower n_craft or curve_n")

    def init_extra(self, **kwargs: Any) -> dict[str, Any]:
        extra = take_extra(self, kwargs)
        extra["lr"] = float(extra["lr"])
        extra["objective"] = extra["objective"] or self.default_objective
        if self.targeted and extra["objective"] in ("feature", "rce"):
            raise UserError(f"attack {self.name!r}: objective {extra['objective']} is untargeted; a targeted "
                            f"generator uses ce or logit")
        if not self.targeted and extra["objective"] == "logit":
            raise UserError(f"attack {self.name!r}: objective logit is targeted; add targeted: true or use ce, rce or feature")
        if self.conditional:
            if not self.targeted:
                raise UserError(f"attack {self.name!r} is a multi-target (conditional) generator: it needs targeted: true")
            if extra["cond"] == "clip" and not extra["clip"]:
                raise UserError(f"attack {self.name!r}: cond clip needs clip: <zoo entry of an open_clip model>")
        if self.target == "least_likely":
            raise UserError(f"attack {self.name!r}: a generator's targets are random or one class, not least_likely")
        if extra["stop"] == "plateau" and not extra["curve_every"]:
            raise UserError(f"attack {self.name!r}: stop plateau reads the held-out curve; set curve_every: <updates "
                            f"between measurements> (e.g. 500)")
        extra["plateau_gain"] = float(extra["plateau_gain"])
        if extra["output"] == "image" and type(self).generate is not GenerativeAttack.generate:
            raise UserError(f"attack {self.name!r} builds its perturbation its own way; output: image applies to the "
                            f"image-to-image generators (cda, bia, facl, pdcl, ...): drop it")
        if self.targeted and not self.conditional and not _is_class(self.target):
            raise UserError(f"attack {self.name!r}: a single-target generator aims at one class: set target: <class "
                            f"index> (or target: all in a grid); cgnc and dual_flow take a target per image")
        return extra

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if self.conditional:
            kwargs.setdefault("targeted", True)
        super().__init__(*args, **kwargs)

    def grad_evals_formula(self, n_models: int) -> int:
        """Surrogate forward+backward image-passes per training image (``passes_per_update`` per
        model and update)."""
        return math.ceil(self.steps * self.extra["batch"] * n_models * self.passes_per_update()
                         / self.extra["n_craft"])

    def craft_passes(self, n_models: int, n_images: int) -> int:
        """The generator's training: steps × batch × models × passes per update (applying it to
        the test images costs no surrogate pass)."""
        return self.steps * min(self.extra["batch"], self.extra["n_craft"]) * n_models * self.passes_per_update()

    def passes_per_update(self) -> int:
        """Surrogate forward+backward passes per model, image and update (1 for the plain losses)."""
        return 1

    # --- the generator ------------------------------------------------------------------------
    def build(self, n_classes: int, table: torch.Tensor | None) -> nn.Module:
        """A fresh generator (weights from the torch RNG; the caller seeds it)."""
        w, b = self.extra["width"], self.extra["blocks"]
        if not self.conditional:
            return ResnetGenerator(w, b)
        dim = 64 if table is None else int(table.shape[1])
        return Conditioned(ConditionalResnetGenerator(dim, w, b), n_classes, dim, table)

    def generate(self, G: nn.Module, x: torch.Tensor, t: torch.Tensor | None) -> torch.Tensor:
        """x_adv (N×C×H×W in [0,1], inside the ε-ball of x, differentiable in G's weights): with
        ``output: delta`` clip(x + δ, 0, 1) with δ = bound(G(x[, t])); with ``output: image`` G's
        output squashed into an image and projected onto the ball (:func:`project_image`, CDA's)."""
        r = G(x) if t is None else G(x, t)
        if self.extra["output"] == "image":
            return project_image(r, x, self.eps, self.norm)
        return (x + bound(r, self.eps, self.norm)).clamp(0, 1)

    # --- training hooks -----------------------------------------------------------------------
    def train_input(self, st: "TrainState", x: torch.Tensor) -> torch.Tensor:
        """The training batch x (N×C×H×W in [0,1]) as the generator and surrogate see it at update
        ``st.step`` (FACL randomises it here, drawing from ``st.gen``)."""
        return x

    def start(self, st: "TrainState") -> None:
        """Called once before the first update (after the generator is built); what a kind
        prepares for its loss goes on ``st``, what it records in ``st.info``."""

    def train_loss(self, st: "TrainState", x: torch.Tensor, x_adv: torch.Tensor, y: torch.Tensor,
             t: torch.Tensor | None) -> torch.Tensor:
        """The scalar to *minimise* for one batch; counts surrogate passes on ``st``."""
        return self.base_loss(st, x, x_adv, y, t)

    def base_loss(self, st: "TrainState", x: torch.Tensor, x_adv: torch.Tensor, y: torch.Tensor,
                  t: torch.Tensor | None) -> torch.Tensor:
        S, obj = st.S, self.extra["objective"]
        w = S.weights.to(x_adv.dtype)
        total = x_adv.new_zeros(())
        if obj == "feature":
            for i, tap in enumerate(st.taps):
                with torch.no_grad():
                    f_clean, _ = tap.features(x)
                f_adv, _ = tap.features(x_adv)
                total = total + w[i] * F.cosine_similarity(f_adv.flatten(1), f_clean.flatten(1), dim=1).mean()
                st.count(len(x), S, i)
            return total
        for i in range(len(S)):
            z_adv = S.logits(x_adv, i)
            if obj == "rce":
                with torch.no_grad():
                    z = S.logits(x, i)
                li = -F.cross_entropy(z_adv - z, z.argmax(1))
            elif obj == "ce":
                li = F.cross_entropy(z_adv, t) if self.targeted else -F.cross_entropy(z_adv, y)
            else:  # logit: raise the target's logit
                li = -z_adv.gather(1, t[:, None]).mean()
            total = total + w[i] * li
            st.count(len(x), S, i)
        return total

    # --- the loop ---------------------------------------------------------------------------
    def train(self, S: SurrogateSet, x: torch.Tensor, y: torch.Tensor, device: str = "cpu",
              table: torch.Tensor | None = None, aux: dict[str, nn.Module] | None = None,
              log: Callable[[str], None] | None = None,
              held: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[nn.Module, dict[str, Any]]:
        """Train the generator on images ``x`` (N×C×H×W in [0,1], any device) with true labels
        ``y``. ``table``: fixed condition vectors (classes×D) for ``cond: clip``; ``aux``: further
        models the attack uses (a CLIP model); ``held``: images and labels never trained on, for
        the curve (``curve_every`` > 0). Returns (the generator in eval mode, training info:
        ``evals_per_image``, ``train_s``, ``loss_first``/``loss_last`` (mean of the first/last
        10% of updates), ``params``, ``updates`` (made; fewer than ``steps`` when the plateau
        rule stopped the training), ``curve`` (``[updates, surrogate passes, held-out fooling
        rate]`` before the first update and every ``curve_every`` updates; empty without a curve),
        ``plateau_at`` (the updates of the curve point it flattened after, None if it did not),
        and what the kind records, e.g. PDCL's ``prompt_losses``).

        Measuring the curve draws no randomness and leaves the generator's weights and batch-norm
        statistics alone (eval mode), so a curve does not change what a budget-stopped run
        trains. The surrogate set is bound for this training run only; it is not changed."""
        S = S.bind(self.objective())
        n, bs = len(x), min(self.extra["batch"], len(x))
        with torch.no_grad():
            n_classes = int(S.mean_logits(x[:2].to(device)).shape[1])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            G = self.build(n_classes, table)
        G = G.to(device=device, dtype=x.dtype)
        opt = torch.optim.Adam([p for p in G.parameters() if p.requires_grad], lr=self.extra["lr"], betas=(0.5, 0.999))
        gen = torch.Generator().manual_seed(self.seed)
        order, pos = torch.randperm(n, generator=gen), 0
        st = TrainState(S, n_classes, aux or {}, gen)
        st.train_x, st.train_y, st.device = x, y, device
        losses: list[float] = []
        t0 = time.perf_counter()
        layer_models = S.models if self.extra["objective"] == "feature" else []
        for m, name in zip(layer_models, S.names):
            check_plain(m, name, f"attack {self.name!r} trains on one network's layer features (objective feature): "
                                 f"use a plain surrogate, or a logit objective (cda, cgnc, dual_flow)")
        every = int(self.extra["curve_every"])
        if every and held is None:
            raise UserError(f"attack {self.name!r}: curve_every needs held-out training images; run it in a grid "
                            f"(the images after the first n_craft) or set curve_every: 0")
        curve: list[list[float]] = []
        plateau_at: int | None = None
        updates = 0

        def measure(done: int) -> int | None:
            """Add the curve point after ``done`` updates; the plateau's point if the rule stops here."""
            G.eval()
            rate = self.fit_rate(G, S, held[0], held[1], device, max(bs, 250), n_classes)
            curve.append([done, st.evals, rate])
            if log is not None:
                log(f"  {self.name}: {done} updates, held-out fooling rate {100 * rate:.1f}%")
            if self.extra["stop"] != "plateau":
                return None
            at = plateau([c[2] for c in curve], int(self.extra["patience"]), self.extra["plateau_gain"])
            return None if at is None else int(curve[at][0])

        with taps(layer_models, self.extra["layer"], S.names, tuple(x.shape[1:])) as T:
            st.taps = T
            self.start(st)
            params = [p for p in G.parameters() if p.requires_grad]
            if every:
                measure(0)
            for step in range(self.steps):
                if pos + bs > n:
                    order, pos = torch.randperm(n, generator=gen), 0
                sel = order[pos:pos + bs]
                pos += bs
                xb, yb = x[sel].to(device), y[sel].to(device)
                st.step = step
                xb = self.train_input(st, xb)
                tb = None
                if self.targeted:
                    tb = self.train_targets(yb, n_classes, gen)
                S.advance()
                G.train()
                losses.append(self.update(G, opt, params, st, xb, yb, tb))
                updates = step + 1
                if log is not None and updates % max(1, self.steps // 5) == 0:
                    log(f"  {self.name}: update {updates}/{self.steps}, loss {sum(losses[-20:]) / len(losses[-20:]):.4f}")
                if every and (updates % every == 0 or updates == self.steps):
                    plateau_at = measure(updates)
                    if plateau_at is not None:
                        if log is not None:
                            log(f"  {self.name}: the held-out fooling rate flattened after {plateau_at} updates; "
                                f"stopped at {updates}")
                        break
        G.eval()
        if every and plateau_at is None:  # where the rule would have stopped a budget-stopped run, if anywhere
            for j in range(1, len(curve) + 1):
                at = plateau([c[2] for c in curve[:j]], int(self.extra["patience"]), self.extra["plateau_gain"])
                if at is not None:
                    plateau_at = int(curve[at][0])
                    break
        k = max(1, len(losses) // 10)
        info = {"evals_per_image": math.ceil(st.evals / n), "train_s": time.perf_counter() - t0,
                "loss_first": sum(losses[:k]) / k, "loss_last": sum(losses[-k:]) / k, "params": count_params(G),
                "passes": st.evals, "aux_passes": st.aux_passes, "updates": updates, "curve": curve,
                "plateau_at": plateau_at, **st.info}
        return G, info

    def fit_rate(self, G: nn.Module, S: SurrogateSet | SurrogateCall, xs: torch.Tensor, ys: torch.Tensor, device: str,
                 batch_size: int, n_classes: int, index: torch.Tensor | None = None) -> float:
        """The surrogate set's fooling rate (targeted: target hit rate) on generator G's examples of
        images ``xs`` (N×C×H×W in [0,1]) with labels ``ys``, over the images it classifies
        correctly (targeted: and whose target is not their label). A targeted generator aims at
        :func:`make_targets` of (seed + 1, ``index``: 0..N−1 by default) or its one class."""
        ts = None
        if self.targeted:
            from .base import make_targets

            ts = (torch.full_like(ys, self.target) if _is_class(self.target) else
                  make_targets(ys, torch.arange(len(ys)) if index is None else index, self.seed + 1, n_classes))
        from ..core.metrics import predict_batched

        xa = self.apply(G, xs, ts, batch_size, device)
        pc = predict_batched(S.predict, xs, batch_size, device)
        pa = predict_batched(S.predict, xa, batch_size, device)
        ok = (pc == ys) & (ts != ys) if self.targeted else pc == ys  # an image of the target class cannot show a hit
        hit = (pa == ts) if self.targeted else (pa != ys)
        return float((hit & ok).sum() / ok.sum().clamp_min(1))

    @torch.no_grad()
    def delta_stats(self, G: nn.Module, x: torch.Tensor, t: torch.Tensor | None, batch_size: int,
                    device: str) -> tuple[float, float]:
        """:func:`perturbation_stats` of the generator's perturbations δ = x_adv − x of images ``x``
        (N×C×H×W in [0,1]; targets ``t`` for a conditional one): (share at the ε bound, share of δ's
        energy common to every image; both 1 for a generator collapsed into one universal ±ε δ)."""
        return perturbation_stats(self.apply(G, x, t, batch_size, device) - x, self.eps, self.norm)

    def update(self, G: nn.Module, opt: torch.optim.Optimizer, params: list[torch.Tensor], st: "TrainState",
               x: torch.Tensor, y: torch.Tensor, t: torch.Tensor | None) -> float:
        """One training update on batch x (true labels y, targets t): generate, take the loss,
        step the optimiser. Returns the loss."""
        with torch.enable_grad():
            x_adv = self.generate(G, x, t)
            loss = self.train_loss(st, x, x_adv, y, t)
        step(opt, params, loss)
        return float(loss.detach())

    def train_targets(self, y: torch.Tensor, n_classes: int, g: torch.Generator) -> torch.Tensor:
        """A uniform random class other than y per image (training targets of a targeted generator)."""
        fixed = self.target if _is_class(self.target) else None
        if fixed is not None and not self.conditional:
            return torch.full_like(y, fixed)
        off = torch.randint(1, n_classes, (len(y),), generator=g).to(y.device)
        return (y + off) % n_classes

    @torch.no_grad()
    def apply(self, G: nn.Module, x: torch.Tensor, t: torch.Tensor | None, batch_size: int, device: str) -> torch.Tensor:
        """x_adv for images ``x`` (N×C×H×W in [0,1]) and targets ``t`` (N, conditional) in batches."""
        out = []
        for s in range(0, len(x), batch_size):
            tb = None if t is None else t[s:s + batch_size].to(device)
            out.append(self.generate(G, x[s:s + batch_size].to(device).to(next(G.parameters()).dtype), tb).cpu())
        return torch.cat(out) if out else x.clone()

    def condition_table(self, ctx: CraftContext | None) -> tuple[torch.Tensor | None, dict[str, nn.Module]]:
        """(fixed condition vectors or None, auxiliary models) for this attack. A conditional
        attack with ``cond: clip`` takes the CLIP text embeddings of the class names (classes×D:
        the zoo entry's zero-shot head, its prompt templates averaged) through the context, or from
        ``attack.clip_model`` when called outside a grid."""
        if not self.conditional or self.extra["cond"] != "clip":
            return None, {}
        clip = self.clip(ctx)
        head = getattr(clip, "head", None)
        if head is None:
            raise UserError(f"attack {self.name!r}: model {self.extra['clip']!r} has no zero-shot text head; "
                            f"cond clip needs an open_clip zoo entry")
        return head.detach().T.cpu(), {}

    def clip(self, ctx: CraftContext | None) -> nn.Module:
        """The CLIP model named by ``clip``: ``attack.clip_model`` if set, else loaded through the
        grid's context."""
        clip = getattr(self, "clip_model", None)
        if clip is None:
            if ctx is None or ctx.load_model is None:
                raise UserError(f"attack {self.name!r} needs a CLIP model: run it in a grid (parameter clip) or set "
                                f"attack.clip_model")
            clip = ctx.load_model(str(self.extra["clip"]))
        return clip

    def craft(self, S: SurrogateSet, ctx: CraftContext) -> Crafted:
        """A generative cell: train the generator on training images 0..n_craft−1, perturb the
        evaluation images. Targeted attacks aim at the grid's targets (random per image, or one
        class whose own images are left out). Row fields: ``n_craft``, the surrogate set's fooling
        rate (targeted: target hit rate) on up to CRAFT_FIT_IMAGES training images, ``gen_params``,
        ``gen_train_s``."""
        if ctx.train_data is None:
            raise UserError(f"attack {self.name!r} trains a generator on training images; this context has none")
        n_craft, n_held = self.extra["n_craft"], self.extra["curve_n"] if self.extra["curve_every"] else 0
        x_tr, y_tr, _ = ctx.train_data(n_craft + n_held)
        held = (x_tr[n_craft:], y_tr[n_craft:]) if n_held else None
        x_tr, y_tr = x_tr[:n_craft], y_tr[:n_craft]
        table, aux = self.condition_table(ctx)
        t0 = time.perf_counter()
        G, info = self.train(S, x_tr, y_tr, ctx.device, table, aux, ctx.log, held)
        x, y, index = ctx.x, ctx.y, ctx.index
        target = None
        if self.targeted:
            target = self.choose_targets(S, ctx)
            if _is_class(self.target):
                keep = y != self.target
                x, y, index, target = x[keep], y[keep], index[keep], target[keep]
        x_adv = self.apply(G, x, target, ctx.batch_size, ctx.device)
        craft_s = time.perf_counter() - t0
        at_bound, universal = perturbation_stats(x_adv - x, self.eps, self.norm)  # the x_adv just made, not a second pass
        # how well the generator fits its training images (surrogate set, the first CRAFT_FIT_IMAGES)
        xs, ys = x_tr[:CRAFT_FIT_IMAGES], y_tr[:CRAFT_FIT_IMAGES]
        n_classes = int(S.mean_logits(xs[:1].to(ctx.device)).shape[1])
        fields = {"n_craft": len(x_tr), "craft_fooling_rate": self.fit_rate(G, S, xs, ys, ctx.device, ctx.batch_size, n_classes),
                  "gen_params": int(info["params"]), "gen_train_s": float(info["train_s"]),
                  "surrogate_passes": float(info["passes"]), "gen_at_bound": at_bound, "gen_universal": universal}
        if info["curve"]:
            fields.update({"gen_updates": int(info["updates"]), "gen_curve": json.dumps(info["curve"]),
                           "gen_plateau_at": float("nan") if info["plateau_at"] is None else float(info["plateau_at"])})
        if info["aux_passes"]:
            fields["aux_passes"] = float(info["aux_passes"])
        if ctx.progress is not None:
            ctx.progress(len(ctx.x))
        tensors = {f"gen.{k}": v.detach().cpu().contiguous() for k, v in G.state_dict().items()}
        if ctx.log is not None:
            ctx.log(f"{self.name}: {info['updates']} updates in {info['train_s']:.0f} s, loss {info['loss_first']:.3f} → "
                    f"{info['loss_last']:.3f}, {info['evals_per_image']} surrogate passes per training image")
        return Crafted(x_adv, index, target, int(info["evals_per_image"]), craft_s, tensors=tensors, fields=fields)

    def perturb(self, S: SurrogateCall, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> Perturbed:
        """Called as a plain attack: trains the generator on these very images (true labels: the
        call's ``objective.y_true``) and perturbs them (targeted: toward ``y``, the targets).
        Returns the examples with the surrogate passes per image as ``grad_evals`` and the
        trained ``generator`` and its training ``info`` in ``extras``."""
        y_true = S.objective.y_true if S.objective.y_true is not None else y
        table, aux = self.condition_table(None)
        G, info = self.train(S.surrogates, x, y_true, str(x.device), table, aux)
        x_adv = self.apply(G, x, y if self.targeted else None, max(1, len(x)), str(x.device)).to(x.dtype)
        return Perturbed(x_adv, int(info["evals_per_image"]), {"generator": G, "info": info})


def plateau(rates: list[float], patience: int, gain: float) -> int | None:
    """Whether a curve of held-out fooling rates (one per measurement, in order) has flattened:
    the index of its best point before the last ``patience`` points (the first such, on ties)
    when none of those ``patience`` points rose above it by ``gain`` or more (rates and ``gain``
    as fractions); None while fewer than ``patience`` + 1 points exist or one of the last rose."""
    if patience < 1 or len(rates) <= patience:
        return None
    head = rates[:-patience]
    best = max(head)
    if max(rates[-patience:]) >= best + gain:
        return None
    return head.index(best)


def _is_class(target: Any) -> bool:
    """A fixed target class (an int, not a bool), as opposed to the per-image modes."""
    return isinstance(target, int) and not isinstance(target, bool)


def step(opt: torch.optim.Optimizer, params: list[torch.Tensor], loss: torch.Tensor) -> None:
    """One optimiser step on ``loss``'s gradient in ``params`` only (the surrogates' weights get
    no gradient)."""
    with torch.enable_grad():
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    for p, g in zip(params, grads):
        p.grad = g
    opt.step()
    opt.zero_grad(set_to_none=True)


class TrainState:
    """What the loss sees during one training run: the surrogate call, its feature taps, the class
    count, auxiliary models, the seeded generator of the training randomness, the update index
    (``step``), the pass counters, what a kind prepared for its loss (``prompt_text``) and what it
    records (``info``, merged into the training info). It lives as long as the run."""

    def __init__(self, S: SurrogateCall, n_classes: int, aux: dict[str, nn.Module], gen: torch.Generator) -> None:
        self.S, self.n_classes, self.aux, self.gen = S, n_classes, aux, gen
        self.taps: list = []
        self.step = 0
        self.info: dict[str, Any] = {}
        self.prompt_text: torch.Tensor | None = None  # PDCL: the learned class texts (classes×D)
        self.evals = 0
        self.aux_passes = 0  # image-passes through auxiliary models (CLIP), forward+backward
        self.train_x = self.train_y = None
        self.device = "cpu"

    def count(self, n_images: int, S: SurrogateCall, i: int) -> None:
        """One forward+backward pass of ``n_images`` images through member i."""
        self.evals += n_images * S.evals_per_call(i)
