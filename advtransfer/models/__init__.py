"""Architectures (own CIFAR-scale nets and timm builders), the model zoo (catalogue, cards,
weight store, training and loading) and multi-sample surrogate collections."""
from .archs import ARCHS, ImageClassifier, build_arch
from .collections import build_collection, check_options, is_collection
from .zoo import (CARD_VERSION, CollectionSource, DefendedSource, ModelSpec, PretrainedSource, Source,
                  TrainedSource, declared, ensure_trained, get_spec, instantiate, is_trained, load_members,
                  load_model, load_specs, load_states, make_card, prepare_pretrained, read_card, resolve,
                  split_checkpoint, train_spec, write_card, zoo_dirs, zoo_paths)

__all__ = ["ARCHS", "CARD_VERSION", "CollectionSource", "DefendedSource", "ImageClassifier", "ModelSpec",
           "PretrainedSource", "Source", "TrainedSource", "build_arch", "build_collection", "check_options",
           "declared", "ensure_trained", "get_spec", "instantiate", "is_collection", "is_trained", "load_members",
           "load_model", "load_specs", "load_states", "make_card", "prepare_pretrained", "read_card", "resolve",
           "split_checkpoint", "train_spec", "write_card", "zoo_dirs", "zoo_paths"]
