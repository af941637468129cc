"""Admix (Wang et al. 2021): MI-FGSM whose gradient is the mean over m2 admixed images
x + η·x' (x' another image) and m1 scale copies of each, γ_i·(x + η·x'), γ_i = 1/2^i."""
from __future__ import annotations

import copy
import functools

import torch

from ..core.errors import UserError
from .base import CraftContext, Crafted, SurrogateSet, register_attack
from .params import Param
from .iterative import CopyAveragedAttack


@register_attack("admix", kind="gradient", version=1)
class Admix(CopyAveragedAttack):
    """Parameters: ``n_scales`` (m1 = 5), ``n_mix`` (m2 = 3), ``portion`` (η = 0.2), ``n_pool``
    (1000), ``momentum`` (1.0). Cost: T·m1·m2 per model.

    The mixed-in images x' are drawn, per image and step from its own generator, out of the
    first ``n_pool`` training images (the attacker's own data). The authors' code takes them from
    the same batch, which would make an image's result depend on the batch it lands in; with a
    fixed pool it does not. Through the grid the pool comes from the cell's training split; called
    directly, give it with :meth:`set_pool` (x_pool: M×C×H×W in [0,1]), or the first ``n_pool``
    CIFAR-10 training images are used."""

    parameters = {**CopyAveragedAttack.parameters, "n_scales": Param(5, "int", lo=1, doc="scale copies m1"),
                  "n_mix": Param(3, "int", lo=1, doc="admixed images m2"),
                  "portion": Param(0.2, "number", lo=0, doc="admix strength η"),
                  "n_pool": Param(1000, "int", lo=1, doc="images the admixed ones are drawn from")}

    def init_extra(self, **kwargs):
        extra = super().init_extra(**kwargs)
        self._pool: torch.Tensor | None = None
        return extra

    def set_pool(self, x_pool: torch.Tensor) -> "Admix":
        """The images mixed in (M×C×H×W in [0,1]); the first ``n_pool`` are used. Configuration,
        like the parameters: give it before the calls it serves."""
        self._pool = x_pool[: int(self.extra["n_pool"])].detach()
        return self

    def craft(self, S: SurrogateSet, ctx: CraftContext) -> Crafted:
        if ctx.train_data is None:
            raise UserError("admix mixes in training images: the cell gives it no training data")
        # a copy configured with the cell's pool: the cell leaves this attack as it was
        configured = copy.copy(self).set_pool(ctx.train_data(int(self.extra["n_pool"]))[0].to(ctx.device))
        return CopyAveragedAttack.craft(configured, S, ctx)

    def n_copies(self) -> int:
        return int(self.extra["n_scales"]) * int(self.extra["n_mix"])

    def setup(self, x: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, list[torch.Generator]]:
        """(the pool on x's device and dtype, one generator per image) for this call."""
        pool = self._pool
        if pool is None:
            if tuple(x.shape[1:]) != (3, 32, 32):
                raise UserError(f"admix needs images to mix in of the attacked size {tuple(x.shape[1:])}: run it "
                                "through a grid, or call attack.set_pool(x_train) first")
            pool = _cifar_pool(int(self.extra["n_pool"]))
        if tuple(pool.shape[1:]) != tuple(x.shape[1:]):
            raise UserError(f"admix: pool images {tuple(pool.shape[1:])} differ in size from the attacked "
                            f"images {tuple(x.shape[1:])}")
        # once per call, not per copy and step
        return pool.to(device=x.device, dtype=x.dtype), self.rngs(index, "admix")

    def copy_transforms(self, state: tuple[torch.Tensor, list[torch.Generator]]) -> list:
        (pool, gens), eta = state, float(self.extra["portion"])
        out = []
        for _ in range(int(self.extra["n_mix"])):
            pick = torch.stack([torch.randint(len(pool), (), generator=g) for g in gens]).to(pool.device)
            other = pool[pick]
            out += [(lambda x, o=other, s=2.0 ** -i: s * (x + eta * o))
                    for i in range(int(self.extra["n_scales"]))]
        return out


@functools.lru_cache(maxsize=1)
def _cifar_pool(n: int) -> torch.Tensor:
    """The first ``n`` CIFAR-10 training images (N×3×32×32 in [0,1]): the pool of a direct call
    without :meth:`Admix.set_pool`."""
    from ..data import eval_subset, load_dataset

    return eval_subset(load_dataset("cifar10", "train"), n)[0].detach()
