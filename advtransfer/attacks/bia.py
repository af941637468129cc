"""BIA's generator loss (Zhang et al. 2022, Beyond ImageNet Attack), the baseline FACL and PDCL
build on: the ResNet image-to-image generator trained to minimise the cosine similarity between
the surrogate's mid-layer features of x_adv and x (no labels needed). BIA's data and
representation normalisation modules (RN, DA) are not included."""
from .base import register_attack
from .generative import GenerativeAttack


@register_attack("bia", kind="generative", version=2)
class BIA(GenerativeAttack):
    """Generator attack with the mid-layer feature loss (``objective: feature`` at ``layer``,
    ``auto`` = the surrogate's middle block). Untargeted."""

    default_objective = "feature"

    def init_extra(self, **kwargs):
        if self.targeted:
            from ..core.errors import UserError

            raise UserError(f"attack {self.name!r} is untargeted (a feature-distance loss); for a targeted "
                            f"generator use cda with targeted: true, cgnc or dual_flow")
        return super().init_extra(**kwargs)
