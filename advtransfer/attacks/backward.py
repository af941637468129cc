"""The backward-path attacks' common part (LinBP, SGM): MI-FGSM on surrogates whose backward pass a
:class:`~advtransfer.attacks.surgery.Surgery` changes by hooks while the forward pass stays the
same. A subclass says which surgery in :meth:`BackwardPathAttack.surgery`; this class applies it
around every crafting batch, checks in the preflight that it finds a site in the cell's
surrogates, and crafts on the eager model (hooks do not survive compilation)."""
from __future__ import annotations

from .iterative import IterativeAttack
from .surgery import Surgery, applied, check_sites


class BackwardPathAttack(IterativeAttack):
    """MI-FGSM (``momentum`` 1.0, TransferAttack's default for these attacks) through the surgery
    of :meth:`surgery`. Cost: T gradient evaluations per model, as MI-FGSM."""

    hooks_model = True  # backward-path surgery by hooks: always crafted on the eager model
    default_momentum = 1.0

    def check(self, cell) -> None:
        """The declared checks, then that the surgery finds a site in the cell's surrogates."""
        super().check(cell)
        check_sites(self, cell)

    def surgery(self, shape: tuple[int, ...]) -> Surgery:
        """The backward-path change for inputs of ``shape`` (C×H×W)."""
        raise NotImplementedError

    def perturb(self, S, x, y, index):
        with applied(self.surgery(tuple(x.shape[1:])), S.models):
            return super().perturb(S, x, y, index)
