"""Attack registry. ``create_attack(name, **params)``; ``ATTACKS.names()`` lists them.

Every attack takes pixels in [0,1] (N×C×H×W), ε in that space (e.g. 8/255), and an immutable
:class:`SurrogateSet` (one model or several, plain or a :class:`ModelCollection`); each call binds
it to the attack's :class:`Objective` in a :class:`SurrogateCall` that counts gradient evaluations
per image, and :meth:`Attack.run` returns them with the examples in a :class:`Perturbed`.
"""
from .base import (ATTACKS, Attack, ModelCollection, Objective, Perturbed, SurrogateCall, SurrogateSet,
                   create_attack, register_attack)
from . import fgsm, ifgsm, pgd, mifgsm, nifgsm, difgsm, tifgsm, vmifgsm  # noqa: F401  (registration)
from . import sim, ssa, bsr, admix  # noqa: F401  (input-transformation attacks)
from . import sgm, linbp, pas  # noqa: F401  (backward-path attacks)
from . import ila, fia, naa, dta, repr_push  # noqa: F401  (feature-level attacks)
from . import sgd_uap, xtransfer_uap  # noqa: F401  (universal perturbations)
from . import svre, adaea, cwa, cwa_sam, cwa_cse  # noqa: F401  (ensemble attacks)
from . import cda, bia, facl, pdcl, cgnc, dual_flow  # noqa: F401  (generative attacks)
from . import ecosystem  # noqa: F401  (torchattack:<Name>, torchattacks:<Name>, resolved on first use)

__all__ = ["ATTACKS", "Attack", "ModelCollection", "Objective", "Perturbed", "SurrogateCall", "SurrogateSet",
           "create_attack", "register_attack"]
