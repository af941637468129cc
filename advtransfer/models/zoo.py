"""The model zoo, one import for callers: re-exports the public names of

- :mod:`.catalogue`: YAML entries → :class:`ModelSpec`, common fields plus a tagged :class:`Origin`
  (``load_specs``, ``get_spec``, ``zoo_dirs``),
- :mod:`.cards`: the JSON card beside each model (``read_card``, ``make_card``),
- :mod:`.store`: cache paths and verified safetensors weights,
- :mod:`.sources`: where a model comes from (``resolve`` → a tagged ``Source``: trained,
  collection, pretrained or defended; a new kind is a ``Source`` subclass under ``register_source``),
  ``ensure_trained``, ``train_spec``, ``load_model``, ``load_members``,
- :mod:`.loading`: ``load_states``, ``instantiate``.

Cache layout: ``$ADVTRANSFER_CACHE/zoo/<size>/<name>.safetensors`` and ``<name>.json``.
"""
from __future__ import annotations

from .cards import CARD_VERSION, make_card, read_card, write_card
from .catalogue import ModelSpec, Origin, get_spec, load_specs, split_checkpoint, zoo_dirs
from .loading import instantiate, load_states
from .sources import (CollectionSource, DefendedSource, PretrainedSource, Source, TrainedSource, declared,
                      ensure_trained, is_trained, load_members, load_model, prepare_pretrained, register_source, resolve,
                      train_spec)
from .store import zoo_paths

__all__ = ["CARD_VERSION", "CollectionSource", "DefendedSource", "ModelSpec", "Origin", "PretrainedSource", "Source",
           "TrainedSource", "declared", "ensure_trained", "get_spec", "instantiate", "is_trained", "load_members",
           "load_model", "load_specs", "load_states", "make_card", "prepare_pretrained", "read_card", "register_source",
           "resolve", "split_checkpoint", "train_spec", "write_card", "zoo_dirs", "zoo_paths"]
