"""CDA (Naseer et al. 2019, cross-domain transferable perturbations): a ResNet image-to-image
generator trained with the relativistic cross-entropy CE(f(x_adv) − f(x), argmax f(x)), maximised."""
from .base import register_attack
from .generative import GenerativeAttack


@register_attack("cda", kind="generative", version=2)
class CDA(GenerativeAttack):
    """Generator attack with the relativistic loss (``objective: rce``; ce for a targeted generator
    with one fixed target class). See :mod:`advtransfer.attacks.generative` for the training loop."""

    default_objective = "rce"

    def init_extra(self, **kwargs):
        if self.targeted and not kwargs.get("objective"):
            kwargs = {**kwargs, "objective": "ce"}
        return super().init_extra(**kwargs)
