"""The attack call's shape: an immutable surrogate set, an objective given with each call, the
cost returned with the examples, no per-call state kept on the attack, and a typed protocol for
weight collections (issue 30, point 1)."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn as nn

from advtransfer.attacks import ATTACKS, ModelCollection, Objective, SurrogateSet, create_attack
from advtransfer.attacks.fingerprint import INPUTS, SMALL, TinyClip, default_inputs, fixed_input
from advtransfer.core.errors import UserError
from advtransfer.models.collections import MemberCollection, PosteriorSmoothing


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 5))


def test_surrogate_set_is_immutable_and_an_attack_call_leaves_it_unchanged():
    S = SurrogateSet([_net(0), _net(1)], ["a", "b"], weights=[3.0, 1.0])
    for name in ("models", "names", "weights", "ensemble", "loss", "y_true", "grad_evals"):
        with pytest.raises(AttributeError, match="immutable"):
            setattr(S, name, None)
    models, weights = S.models, S.weights.clone()
    x, y = torch.rand(3, 3, 4, 4), torch.tensor([0, 1, 2])
    res = create_attack("mifgsm", eps=8 / 255, steps=3, loss="logit", ensemble="prob").run(S, x, y)
    assert res.grad_evals == 3 * 2
    assert S.models is models and torch.equal(S.weights, weights) and S.names == ("a", "b")
    assert not hasattr(S, "grad_evals") and not hasattr(S, "loss")
    # a value: it copies and pickles, and the copy is as immutable
    T = pickle.loads(pickle.dumps(S))
    assert T.names == S.names and torch.equal(T.weights, S.weights) and len(T) == 2
    with pytest.raises(AttributeError, match="immutable"):
        copy.deepcopy(S).names = ("c",)


def test_the_objective_travels_with_the_call_not_with_the_set():
    """Two attacks with different losses and ensemble modes on one set give what each gives on a
    fresh set, in either order: nothing of one call reaches the next."""
    S = SurrogateSet([_net(0), _net(1)])
    x, y = torch.rand(4, 3, 4, 4), torch.tensor([0, 1, 2, 3])
    a = create_attack("ifgsm", eps=8 / 255, steps=2, loss="logit")
    b = create_attack("ifgsm", eps=8 / 255, steps=2, ensemble="loss")
    fresh = [a(SurrogateSet(list(S.models)), x, y), b(SurrogateSet(list(S.models)), x, y)]
    assert not torch.equal(fresh[0], fresh[1])  # the two objectives do differ
    torch.testing.assert_close(b(S, x, y), fresh[1], rtol=0, atol=0)
    torch.testing.assert_close(a(S, x, y), fresh[0], rtol=0, atol=0)
    # the bound call reads its objective: the logit loss is linear in the logits
    W = [m[1].weight.detach() for m in S.models]
    g = S.bind(Objective(loss="logit")).grad(x, y)
    torch.testing.assert_close(g.flatten(1), -(W[0][y] + W[1][y]) / 2)
    with pytest.raises(UserError, match="unknown ensemble mode"):
        Objective(ensemble="median")


@pytest.mark.parametrize("name", ATTACKS.names())
def test_attacks_keep_no_per_call_state(name):
    """Every registered attack, called twice on the fingerprint inputs: its attributes after the
    calls are the ones it had before (same objects, same parameters), and the second call gives
    the first call's examples and cost."""
    assert default_inputs(name) in INPUTS
    models, x, y, index = fixed_input(residual=default_inputs(name) == "residual",
                                      deep=default_inputs(name) == "deep")
    atk = create_attack(name, eps=8 / 255, steps=2, **SMALL.get(name, {}))
    if SMALL.get(name, {}).get("clip"):
        atk.clip_model = TinyClip()
    before = dict(vars(atk))
    extra = {k: (list(v) if isinstance(v, list) else v) for k, v in atk.extra.items()}
    goal = (y + 1) % 10 if atk.targeted else y
    first = atk.run(SurrogateSet(models), x, goal, index, y_true=y)
    second = atk.run(SurrogateSet(models), x, goal, index, y_true=y)
    after = vars(atk)
    assert after.keys() == before.keys(), f"{name} added {sorted(after.keys() - before.keys())} on a call"
    assert all(after[k] is before[k] for k in before), [k for k in before if after[k] is not before[k]]
    assert atk.extra == extra
    torch.testing.assert_close(second.x_adv, first.x_adv, rtol=0, atol=0)
    assert second.grad_evals == first.grad_evals > 0
    if atk.kind == "universal":
        assert first.extras["delta"].shape == (1, *x.shape[1:])
    if atk.kind == "generative":
        assert isinstance(first.extras["generator"], nn.Module) and "evals_per_image" in first.extras["info"]


def test_collections_follow_the_protocol_and_plain_models_do_not():
    members = [_net(0), _net(1), _net(2)]
    for coll in (MemberCollection(members, per_step=2), PosteriorSmoothing(_net(3), 0.01, 0.0, per_step=2)):
        assert isinstance(coll, ModelCollection)
        coll.advance()
        outs = coll.step_logits(torch.rand(2, 3, 4, 4))
        assert len(outs) == coll.evals_per_call == 2
    assert not isinstance(_net(0), ModelCollection)
    S = SurrogateSet([MemberCollection(members, per_step=2), _net(4)])
    assert [S.is_collection(i) for i in range(2)] == [True, False]
    assert [S.evals_per_call(i) for i in range(2)] == [2, 1]
    call = S.bind()
    call.advance()
    call.grad(torch.rand(2, 3, 4, 4), torch.tensor([0, 1]))
    assert call.grad_evals == 3  # two draws of the collection, one plain model
