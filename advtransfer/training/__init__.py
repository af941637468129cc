"""Training methods for zoo models, registered by the recipe's ``method``.

A trainer is ``fn(net, recipe, data, ctx) -> TrainOutput`` where ``net`` is a freshly
built :class:`~advtransfer.models.ImageClassifier` (pixels in [0,1]), ``data`` the training split
(for ``init_from`` recipes the zoo has loaded the starting weights into ``net``), ``recipe`` the
resolved recipe (exactly the dict whose hash names the model) and ``ctx`` the run's
:class:`~.context.TrainingContext` (entry name, device, progress, resume file, loaded sources).
Methods: standard (with ``keep_epochs`` for early-stopped entries; ``noise_sigma`` trains the
base of randomized smoothing), fgsm_at, sam, lgv, swag, csgld; the trained defences pgd_at,
trades, ensemble_at and pubdef (these two train against the recipe's static ``sources``) and
dverge (an ensemble entry); shot_im adapts a model to an unlabelled shifted domain.
Each is registered with :func:`~.base.register_method` and a ``VERSION`` (bump it when a code
change alters the weights a recipe produces: the version enters the recipe hash and the card).
Training leaves torch's global random state as it found it.
"""
from .base import TRAINERS, TrainOutput, method_version, register_method, train_from_recipe
from .context import TrainingContext
from . import standard  # noqa: F401  (registers 'standard' and 'fgsm_at')
from . import fast  # noqa: F401  (airbench's fast-training techniques: the converged zoo)
from . import csgld, lgv, sam, swag  # noqa: F401  (surrogate-training methods)
from . import dverge, ensemble_at, pgd_at, pubdef, trades  # noqa: F401  (trained defences)
from . import shot  # noqa: F401  (source-free domain adaptation)

__all__ = ["TRAINERS", "TrainOutput", "TrainingContext", "method_version", "register_method", "train_from_recipe"]
