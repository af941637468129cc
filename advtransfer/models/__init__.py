"""Architectures (own CIFAR-scale nets and timm builders), the model zoo (catalogue, cards,
weight store, training and loading) and multi-sample surrogate collections."""
from .archs import ARCHS, ImageClassifier, build_arch
from .collections import build_collection, check_options, is_collection
from .zoo import (CARD_VERSION, ModelSpec, ensure_trained, get_spec, instantiate, is_trained, load_members,
                  load_model, load_specs, load_states, make_card, prepare_pretrained, read_card,
                  split_checkpoint, train_spec, write_card, zoo_dirs, zoo_paths)

__all__ = ["ARCHS", "CARD_VERSION", "ImageClassifier", "ModelSpec", "build_arch", "build_collection",
           "check_options", "ensure_trained", "get_spec", "instantiate", "is_collection", "is_trained",
           "load_members", "load_model", "load_specs", "load_states", "make_card", "prepare_pretrained",
           "read_card", "split_checkpoint", "train_spec", "write_card", "zoo_dirs", "zoo_paths"]
