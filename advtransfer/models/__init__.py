"""Architectures (own CIFAR-scale nets and timm builders) and the model zoo."""
from .archs import ARCHS, ImageClassifier, build_arch

__all__ = ["ARCHS", "ImageClassifier", "build_arch"]
