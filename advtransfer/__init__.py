"""advtransfer: an adversarial-transferability benchmark harness.

Craft adversarial examples on surrogate models, evaluate them on a grid of victims, and write
tidy result tables and transfer-matrix plots. Pixels are in [0, 1] (N×C×H×W) throughout;
ε is given in that space (e.g. 8/255); normalisation lives inside each model.
"""
__version__ = "0.1.0"

from .core.errors import UserError  # noqa: E402  (core/errors.py imports nothing)


def load_model(name: str, size: str | None = None, cache=None, device: str = "cpu", member: int | None = None):
    """The module a grid attacks for zoo entry ``name`` (a collection for an LGV, cSGLD or SWAG
    entry); ``member=k``: its k-th network instead. See :func:`advtransfer.models.zoo.load_model`."""
    from .models.zoo import load_model as _load

    return _load(name, size=size, cache=cache, device=device, member=member)


def create_attack(name: str, **params):
    """Create a registered attack by name (see :func:`advtransfer.attacks.create_attack`)."""
    from .attacks import create_attack as _create

    return _create(name, **params)


__all__ = ["__version__", "UserError", "load_model", "create_attack"]
