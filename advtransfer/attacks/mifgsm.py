"""MI-FGSM (Dong et al. 2018): g ← μ·g + ∇/‖∇‖₁ per sample; x ← Π(x + α·sign(g))."""
from .base import register_attack
from .iterative import IterativeAttack


@register_attack("mifgsm", kind="gradient", version=1)
class MIFGSM(IterativeAttack):
    """Momentum μ = 1.0 and α = ε/T by default."""

    default_momentum = 1.0
