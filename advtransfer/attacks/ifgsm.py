"""I-FGSM / BIM (Kurakin et al. 2017): T projected steps of size α (default ε/T)."""
from .base import register_attack
from .iterative import IterativeAttack


@register_attack("ifgsm", kind="gradient", version=1, aliases="bim")
class IFGSM(IterativeAttack):
    """Iterative FGSM without momentum; α = ε/T by default."""
