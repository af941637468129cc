"""What a training run needs besides its recipe: the run-time facts the zoo knows when it trains an
entry (its name, where its resume state lives, the loaded source models, the device, whether to
show progress).

They used to ride inside the recipe dict under private keys (``_name``, ``_resume``, ``_sources``)
that every reader had to filter out again (the card, the resume file's recipe); the recipe is now
only the recipe, the dict whose hash names the model, and this value travels beside it:
:func:`~advtransfer.training.base.train_from_recipe` hands it to every trainer, registered as
``fn(net, recipe, data, ctx) -> TrainOutput``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import torch.nn as nn


def _no_sources() -> Mapping[str, nn.Module]:
    return MappingProxyType({})


@dataclass(frozen=True)
class TrainingContext:
    """The run-time side of one training run (never part of the recipe or its hash).

    ``name``: the zoo entry being trained (messages, the progress bar); ``device``: where it
    trains (``cpu``, ``cuda``, ...); ``progress``: whether a progress bar is shown; ``resume``:
    the file a resumable method saves its state to after every epoch and continues from
    (:mod:`advtransfer.training.resume`), None to train in one go; ``sources``: the recipe's
    static ``sources`` as loaded, frozen modules (zoo name -> network of pixels in [0,1]), for
    the methods that train against them (ensemble_at, pubdef), empty otherwise.
    """

    name: str = "training"
    device: str = "cpu"
    progress: bool = True
    resume: Path | None = None
    sources: Mapping[str, nn.Module] = field(default_factory=_no_sources, compare=False)

    def __post_init__(self) -> None:
        if self.resume is not None and not isinstance(self.resume, Path):
            object.__setattr__(self, "resume", Path(self.resume))
        if not isinstance(self.sources, MappingProxyType):  # read-only: the context is a value
            object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))
