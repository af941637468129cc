"""PGD (Madry et al. 2018): I-FGSM from a uniform random start in the ε-ball."""
from .base import register_attack
from .iterative import IterativeAttack


@register_attack("pgd", kind="gradient", version=1)
class PGD(IterativeAttack):
    """Random start drawn per image from (seed, dataset index); α = 2.5·ε/T by default
    (2/255 for ε = 8/255, T = 10)."""

    random_start = True

    def default_alpha(self) -> float:
        return 2.5 * self.eps / self.steps
