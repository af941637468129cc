"""Fast checks of the registries and the data loader."""
import pytest
import torch

from advtransfer.attacks import ATTACKS, create_attack
from advtransfer.data import eval_subset, load_cifar10
from advtransfer.core.errors import UserError


def test_cifar10_official_order_and_range():
    ds = load_cifar10("test")
    x, y, idx = eval_subset(ds, 5)
    assert x.shape == (5, 3, 32, 32) and x.dtype == torch.float32
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    # official order: cat, ship, ship, airplane, frog
    assert y.tolist() == [3, 8, 8, 0, 6]
    assert idx.tolist() == [0, 1, 2, 3, 4]
    assert ds.lossless[:1000].all()


def test_unknown_attack_suggests_close_match():
    with pytest.raises(UserError, match="mifgsm"):
        create_attack("mifgsn")


def test_registry_has_the_baseline_attacks():
    for name in ("fgsm", "ifgsm", "pgd", "mifgsm", "nifgsm", "difgsm", "tifgsm", "vmifgsm"):
        assert name in ATTACKS


@pytest.mark.parametrize("eps", ["0", "-1/255", "2", "abc"])
def test_bad_eps_is_rejected(eps):
    with pytest.raises(UserError):
        create_attack("ifgsm", eps=eps)
