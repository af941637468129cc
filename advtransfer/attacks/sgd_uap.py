"""SGD-UAP: one universal δ against the whole surrogate set (its loss, every update)."""
from .base import register_attack
from .universal import UniversalAttack


@register_attack("sgd_uap", kind="universal", version=1)
class SGDUAP(UniversalAttack):
    """Minibatch sign-SGD on mean(min(L, β)) over the crafting images; α = ε/5 decayed ×0.7 per epoch.
    With several surrogates L is the set's ensemble loss (``ensemble``: logit by default)."""

    def member_losses(self, S, x, y, chosen):
        obj = S.loss(x, y)
        ce = -obj if self.targeted else obj
        return ce.clamp(max=self.extra["beta"]).mean().view(1)
