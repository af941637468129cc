"""NI-FGSM (Lin et al. 2020): MI-FGSM with the gradient taken at the Nesterov look-ahead
point x + α·μ·g."""
from .base import register_attack
from .iterative import IterativeAttack


@register_attack("nifgsm", kind="gradient", version=1)
class NIFGSM(IterativeAttack):
    """μ = 1.0, α = ε/T by default."""

    default_momentum = 1.0
    nesterov = True
