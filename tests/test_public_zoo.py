"""Public CIFAR-10 zoo entries (victims/cifar10_public.yaml), offline.

The chenyaofo/pytorch-cifar-models releases and RobustBench checkpoints cannot be downloaded here:
each cifar_hub architecture is checked with a state dict of its own RANDOM INITIALISATION saved to
a temporary file (given as ``weights:``, with the pinned sha256 prefix replaced by that file's);
the download path with torch.hub's function replaced. These check wiring, strict state-dict keys,
checksums, shapes and the [0,1] input convention only; no number is reported from them. That the
modules match upstream's state-dict layout key for key was checked against the upstream code when
cifar_hub.py was written (upstream is not a dependency); the parameter counts below are the ones
upstream's README lists."""
import dataclasses
import os
import re
import sys
import urllib.error

import pytest
import torch
import yaml

from advtransfer.core.errors import UserError
from advtransfer.models import cifar_hub

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUBLIC = os.path.join(REPO, "victims", "cifar10_public.yaml")

# millions of parameters, as in the collection's README (CIFAR-10 table)
PARAMS_M = {"resnet20": 0.27, "resnet32": 0.47, "resnet44": 0.66, "resnet56": 0.86, "vgg11_bn": 9.76,
            "vgg13_bn": 9.94, "vgg16_bn": 15.25, "vgg19_bn": 20.57, "mobilenetv2_x0_5": 0.70,
            "mobilenetv2_x0_75": 1.37, "mobilenetv2_x1_0": 2.24, "mobilenetv2_x1_4": 4.33,
            "shufflenetv2_x0_5": 0.35, "shufflenetv2_x1_0": 1.26, "shufflenetv2_x1_5": 2.49,
            "shufflenetv2_x2_0": 5.37, "repvgg_a0": 7.84, "repvgg_a1": 12.82, "repvgg_a2": 26.82}


@pytest.fixture
def zoo(tmp_path, monkeypatch, cache_dir):
    """``write(entries)``: a zoo of just these entries (ADVTRANSFER_ZOO → a temporary folder);
    torch.hub's cache folder is a temporary one too."""
    d = tmp_path / "zoo"
    d.mkdir()
    monkeypatch.setenv("ADVTRANSFER_ZOO", str(d))
    hub = tmp_path / "hub"
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(hub))

    def write(entries):
        (d / "public_test.yaml").write_text(yaml.safe_dump({"models": entries}))

    return write


def _saved_state(tmp_path, arch: str, seed: int = 1):
    """A random-init state dict of ``arch`` saved with torch.save; (path, state, sha256 prefix)."""
    from advtransfer.core.utils import sha256_file

    from advtransfer.core.rng import seeded

    with seeded(seed):  # the caller's random stream is left as it was
        state = cifar_hub.build_net(arch).state_dict()
    path = tmp_path / f"{arch}.pt"
    torch.save(state, path)
    return path, state, sha256_file(path)[:8]


def _pin(monkeypatch, arch: str, prefix: str) -> None:
    monkeypatch.setitem(cifar_hub.MODELS, arch, dataclasses.replace(cifar_hub.MODELS[arch], sha256_prefix=prefix))


def _one_line(err) -> str:
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


def test_release_table():
    assert cifar_hub.MODELS["resnet20"].url == (
        "https://github.com/chenyaofo/pytorch-cifar-models/releases/download/resnet/cifar10_resnet20-4118986f.pt")
    assert set(cifar_hub.MODELS) == set(PARAMS_M)
    for name, m in cifar_hub.MODELS.items():
        # torch.hub's check_hash reads the prefix from the file name
        assert re.fullmatch(r"[0-9a-f]{8}", m.sha256_prefix)
        assert torch.hub.HASH_REGEX.search(os.path.basename(m.url)).group(1) == m.sha256_prefix
        assert m.url.endswith(f"/{m.release}/cifar10_{name}-{m.sha256_prefix}.pt") and 90 < m.top1 < 95
    assert cifar_hub.HUB_MEAN == (0.4914, 0.4822, 0.4465) and cifar_hub.HUB_STD == (0.2023, 0.1994, 0.2010)


# the whole loading path (weights file, checksum pin, strict keys, [0,1] input) for the smallest
# model of each family; every other size is built and counted (same code, other widths/depths)
WIRED = ["resnet20", "vgg11_bn", "mobilenetv2_x0_5", "shufflenetv2_x0_5", "repvgg_a0"]


@pytest.mark.parametrize("arch", [a for a in PARAMS_M if a not in WIRED])
def test_every_size_builds_with_the_published_parameter_count(arch):
    net = cifar_hub.build_net(arch)
    assert round(sum(p.numel() for p in net.parameters()) / 1e6, 2) == PARAMS_M[arch]


@pytest.mark.parametrize("arch", WIRED)
def test_local_weights_load_strictly_and_take_pixels(zoo, tmp_path, monkeypatch, arch):
    from advtransfer.models import zoo as z

    path, state, prefix = _saved_state(tmp_path, arch)
    _pin(monkeypatch, arch, prefix)
    zoo([{"name": "m", "arch": f"cifar_hub/{arch}", "family": "public", "pretrained": {"weights": str(path)}}])
    model = z.load_model("m")
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 2) == PARAMS_M[arch]
    loaded = model.net.state_dict()
    assert list(loaded) == list(state) and all(torch.equal(loaded[k], state[k]) for k in state)
    # pixels in [0,1], N×3×32×32 → N×10 logits; normalised inside with the collection's mean/std
    seen = []
    model.net.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().clone()))
    x = torch.rand(2, 3, 32, 32)
    out = model(x)
    assert out.shape == (2, 10) and torch.isfinite(out).all()
    mean = torch.tensor(cifar_hub.HUB_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(cifar_hub.HUB_STD).view(1, 3, 1, 1)
    assert torch.allclose(seen[0], (x - mean) / std, atol=1e-6)
    # the URL and pinned prefix are part of the entry's identity (its card's recipe hash)
    ident = z.get_spec("m").identity("ci")
    assert ident["release"] == {"url": cifar_hub.MODELS[arch].url, "sha256_prefix": prefix}


def test_zoo_train_cards_a_weights_file(zoo, tmp_path, monkeypatch, capsys):
    """`advtransfer zoo train <name>` loads and cards an entry (here from a local weights file)."""
    from advtransfer.cli import main
    from advtransfer.models import loading, zoo as z
    from advtransfer.core.utils import sha256_file

    monkeypatch.setattr(loading, "_EVAL_IMAGES", 100)  # wiring only
    path, _, prefix = _saved_state(tmp_path, "resnet20")
    _pin(monkeypatch, "resnet20", prefix)
    zoo([{"name": "hub_r20_file", "arch": "cifar_hub/resnet20", "family": "public",
          "pretrained": {"tag": prefix, "weights": str(path)}}])
    assert main(["zoo", "train", "hub_r20_file", "--size", "ci", "--no-progress"]) == 0
    assert "hub_r20_file" in capsys.readouterr().out
    card = z.read_card("hub_r20_file", "ci")
    assert card["kind"] == "pretrained" and card["sha256"] == sha256_file(path) and 0 <= card["clean_acc"] <= 1
    assert z.is_trained(z.get_spec("hub_r20_file"), "ci")

def test_input_gradients_flow(zoo, tmp_path):
    from advtransfer.models import zoo as z

    zoo([{"name": "r", "arch": "cifar_hub/resnet20", "family": "public", "pretrained": {"random_init": True}}])
    x = torch.rand(2, 3, 32, 32, requires_grad=True)
    (g,) = torch.autograd.grad(z.load_model("r")(x)[:, 0].sum(), x)
    assert torch.isfinite(g).all() and float(g.abs().sum()) > 0


def test_wrong_checksum_and_wrong_layout_are_refused(zoo, tmp_path, monkeypatch):
    from advtransfer.models import zoo as z

    path, _, prefix = _saved_state(tmp_path, "resnet20")
    zoo([{"name": "bad", "arch": "cifar_hub/resnet20", "family": "public", "pretrained": {"weights": str(path)}},
         {"name": "other", "arch": "cifar_hub/resnet32", "family": "public", "pretrained": {"weights": str(path)}}])
    with pytest.raises(UserError) as err:  # pinned 4118986f, the file is another
        z.load_model("bad")
    msg = _one_line(err)
    assert "'bad'" in msg and "4118986f" in msg and "sha256" in msg
    # the right checksum but a resnet20 state dict for resnet32: strict keys refuse it
    _pin(monkeypatch, "resnet32", prefix)
    with pytest.raises(UserError) as err:
        z.load_model("other")
    msg = _one_line(err)
    assert "does not fit CifarResNet" in msg and "missing keys 72" in msg


def test_offline_without_weights_is_one_line(zoo, monkeypatch, capsys):
    from advtransfer.cli import main
    from advtransfer.models import zoo as z

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    zoo([{"name": "hub_r20", "arch": "cifar_hub/resnet20", "family": "public", "pretrained": {"tag": "4118986f"}}])
    with pytest.raises(UserError) as err:
        z.load_model("hub_r20")
    msg = _one_line(err)
    assert "'hub_r20'" in msg and "internet" in msg and "weights:" in msg and cifar_hub.MODELS["resnet20"].url in msg
    assert main(["zoo", "train", "hub_r20", "--size", "ci"]) == 2
    err_line = capsys.readouterr().err.strip()
    assert err_line.startswith("advtransfer: error:") and "\n" not in err_line


def test_download_path_uses_torch_hub_with_check_hash(zoo, tmp_path, monkeypatch):
    from advtransfer.models import zoo as z

    _, state, _ = _saved_state(tmp_path, "resnet20")
    calls = []

    def fake(url, **kwargs):
        calls.append((url, kwargs))
        return state

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", fake)
    zoo([{"name": "hub_r20", "arch": "cifar_hub/resnet20", "family": "public", "pretrained": {"tag": "4118986f"}}])
    model = z.load_model("hub_r20")
    assert torch.equal(model.net.conv1.weight, state["conv1.weight"])
    assert calls == [(cifar_hub.MODELS["resnet20"].url,
                      {"map_location": "cpu", "check_hash": True, "weights_only": True})]

    # a download whose hash differs (torch.hub's error) is one line
    def bad_hash(url, **kwargs):
        raise RuntimeError('invalid hash value (expected "4118986f", got "0123abcd...")')

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", bad_hash)
    with pytest.raises(UserError) as err:
        z.load_model("hub_r20")
    assert "pinned sha256 prefix 4118986f" in _one_line(err)
    # a file in torch.hub's cache that is not the pinned one is refused before loading
    cached = tmp_path / "hub" / "checkpoints" / cifar_hub.MODELS["resnet20"].file_name
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"not the release")
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", fake)
    with pytest.raises(UserError) as err:
        z.load_model("hub_r20")
    assert "cached file" in _one_line(err)


def test_random_init_builds_reproducibly_and_cards_say_so(zoo, monkeypatch):
    from advtransfer.models import loading, zoo as z

    monkeypatch.setattr(loading, "_EVAL_IMAGES", 100)  # the card's accuracy on 100 test images: wiring only

    zoo([{"name": "r20_random", "arch": "cifar_hub/resnet20", "family": "public", "pretrained": {"random_init": True}}])
    rng = torch.random.get_rng_state()
    a, b = z.load_model("r20_random"), z.load_model("r20_random")
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert all(torch.equal(u, v) for u, v in zip(a.state_dict().values(), b.state_dict().values()))
    (card,) = z.ensure_trained(["r20_random"], "ci", log=lambda *_: None)
    assert card["kind"] == "random_init" and card["pretrained"] == {"random_init": True}
    assert card["family"] == "public" and card["clean_acc_images"] == "test 0-99"


def test_entry_errors_are_one_line(zoo):
    from advtransfer.models import zoo as z

    cases = [
        ({"arch": "cifar_hub/resnet21", "pretrained": {"random_init": True}},
         "unknown cifar_hub model 'resnet21'; did you mean"),
        ({"arch": "cifar_hub/resnet20", "pretrained": {"tag": "deadbeef"}}, "pinned to sha256 prefix 4118986f"),
        ({"arch": "cifar_hub/vgg19_bn", "pretrained": {"tag": 57191229}}, 'write tag: "57191229", quoted'),
        ({"arch": "robustbench/Wong2020Fast", "pretrained": {"tag": "Linf", "weights": "/x.pt"}}, "no weights: file"),
        ({"arch": "robustbench/Wong2020Fast", "pretrained": {"tag": "L1"}}, "threat model"),
        ({"arch": "cifar_hubs/resnet20", "pretrained": {"tag": "x"}}, "cifar_hub/<model>"),
    ]
    for entry, expected in cases:
        zoo([{"name": "e", "family": "public", **entry}])
        with pytest.raises(UserError) as err:
            z.load_specs()
        assert expected in _one_line(err)


def test_robustbench_missing_package_is_one_line(zoo, monkeypatch):
    """Whether or not robustbench is installed, the path where it cannot be imported says how to
    install it (RobustBench's own README instruction). Loading a real RobustBench model needs
    the package and internet and is not tested here."""
    from advtransfer.models import zoo as z

    monkeypatch.setitem(sys.modules, "robustbench", None)  # import robustbench → ImportError
    monkeypatch.setitem(sys.modules, "robustbench.utils", None)
    zoo([{"name": "rb", "arch": "robustbench/Wong2020Fast", "family": "defended", "pretrained": {"tag": "Linf"}}])
    with pytest.raises(UserError) as err:
        z.load_model("rb")
    msg = _one_line(err)
    assert "'rb'" in msg and "pip install git+https://github.com/RobustBench/robustbench.git" in msg
    assert z.get_spec("rb").identity("ci")["robustbench"] == {
        "model_name": "Wong2020Fast", "dataset": "cifar10", "threat_model": "Linf"}


def test_public_victims_file_parses(tmp_path, monkeypatch):
    from advtransfer.models.catalogue import load_specs
    from advtransfer.core.resources import catalogue_dirs

    d = tmp_path / "only"
    d.mkdir()
    (d / "cifar10_public.yaml").write_text(open(PUBLIC).read())
    specs = load_specs([d])
    hub = {s.arch.split("/", 1)[1]: s for s in specs.values() if s.arch.startswith("cifar_hub/")}
    rb = {s.arch.split("/", 1)[1]: s for s in specs.values() if s.arch.startswith("robustbench/")}
    assert set(hub) == set(cifar_hub.MODELS)
    assert set(rb) == {"Carmon2019Unlabeled", "Wong2020Fast"}
    for arch, s in hub.items():
        assert s.family == "public" and s.kind == "pretrained" and s.dataset == "cifar10"
        assert s.origin.key == "pretrained" and s.origin.value == {"tag": cifar_hub.MODELS[arch].sha256_prefix}
        assert s.identity("ci")["release"]["url"] == cifar_hub.MODELS[arch].url
    assert all(s.origin.value == {"tag": "Linf"} for s in rb.values())
    # and the shipped catalogue as a whole still loads (no name declared twice)
    monkeypatch.delenv("ADVTRANSFER_ZOO", raising=False)
    assert set(specs) <= set(load_specs(catalogue_dirs()))
