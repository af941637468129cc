"""Training methods for zoo models, registered by the recipe's ``method``.

A trainer is ``fn(net, recipe, data, device, progress) -> TrainOutput`` where ``net`` is a freshly
built :class:`~advtransfer.models.ImageClassifier` (pixels in [0,1]) and ``data`` the training split.
"""
from .base import TRAINERS, TrainOutput, train_from_recipe
from . import standard  # noqa: F401  (registers 'standard' and 'fgsm_at')

__all__ = ["TRAINERS", "TrainOutput", "train_from_recipe"]
