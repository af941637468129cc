"""SGM, the skip gradient method (Wu et al. 2020): MI-FGSM on surrogates whose backward pass decays
the gradient through the residual branches, so more of it flows through the skip connections.

``form: authors`` (the default) computes what the authors' code computes
(csdongxian/skip-connections-matter ``utils_sgm.py``, copied into TransferAttack
``transferattack/model_related/sgm.py`` and torchattack's ``SGM``): the gradient is scaled at
the ReLUs of every residual block except the first block of each stage, and normalised at each
block's output (:class:`~advtransfer.attacks.surgery.SkipGradientAtReLUs`). ``form: equation``
is version 1 of this attack: the paper's equation ∂z_{i+1}/∂z_i = 1 + γ·∂f_i/∂z_i applied to
every residual branch, the first block of a stage included
(:class:`~advtransfer.attacks.surgery.SkipGradient`).
"""
from __future__ import annotations

from .base import register_attack
from .params import Param
from .backward import BackwardPathAttack
from .surgery import SkipGradient, SkipGradientAtReLUs

#: backward-path forms: the authors' code, or the paper's equation (version 1)
FORMS = ("authors", "equation")


@register_attack("sgm", kind="gradient", version=2)
class SGM(BackwardPathAttack):
    """Parameters: ``gamma`` (γ = 0.2: the authors' setting for ResNets under iterative attacks,
    TransferAttack's and torchattack's default; the paper used 0.5 for DenseNets), ``form``
    (``authors``: as the authors' code, see the module docstring; ``equation``: every residual
    branch decayed by γ, version 1, whose default γ was 0.5: ``{form: equation, gamma: 0.5}``
    reproduces version-1 cells), ``momentum`` (1.0, TransferAttack's ``decay=1.``).

    With ``form: authors`` the decay is γ over the ReLUs of a block's branch: γ at the one ReLU
    of a basic block, √γ at each of the two of a bottleneck or a harness inverted residual
    (``gamma = np.power(gamma, 0.5)`` for ResNet-50/101/152); the first block of every stage
    (``'0.relu' not in name``: ``layerK.0`` of a ResNet, ``net.layers.0/3/6`` of a harness
    ResNet-20, a MobileNet's first block and its blocks that change width or stride) is not
    decayed. The per-block normalisation (``backward_hook_norm``) is per sample here (the authors
    divide by ``torch.std`` of the whole batch); it rescales each image's gradient by a positive
    number and so does not change the attack. timm transformer blocks, which the authors' code
    does not cover, get the paper's branch decay in both forms. Models without residual blocks
    in a surrogate set are attacked unchanged; a set with none (or, with ``form: authors``, with
    only first-of-stage blocks) is a UserError. Cost: T per model."""

    parameters = {**BackwardPathAttack.parameters, "gamma": Param(0.2, "number", lo=0, lo_open=True, hi=1, doc="residual-gradient decay γ"),
                  "form": Param("authors", "choice", choices=FORMS, doc="where the decay applies")}

    def surgery(self, shape: tuple[int, ...] | None = None):
        """The backward-path change this attack applies (by ``form``); ``shape`` (C×H×W of the
        inputs) is unused: SGM's sites do not depend on it."""
        g = float(self.extra["gamma"])
        return SkipGradientAtReLUs(g) if self.extra["form"] == "authors" else SkipGradient(g)

