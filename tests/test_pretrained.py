"""Pretrained victims and surrogates that cannot be downloaded here: the open_clip zero-shot path
and the timm data-config path are exercised with architectures at RANDOM INITIALISATION (tiny
open_clip config, timm resnet10t without weights). These check wiring, shapes, gradients,
preprocessing and the zero-shot head only; they are never used for reported numbers. The image
folder source is tested on a handful of generated PNG files."""
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from advtransfer.core.errors import UserError

# A tiny open_clip architecture (random init only): 64 px input so that 32×32 images are resized.
TINY_CLIP = {"embed_dim": 64,
             "vision_cfg": {"image_size": 64, "layers": 2, "width": 128, "patch_size": 16, "head_width": 32},
             "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 128, "heads": 4, "layers": 2}}

ENTRIES = [
    {"name": "tiny_clip_random", "arch": "open_clip/advtransfer-tiny-clip", "family": "clip", "dataset": "cifar10",
     "pretrained": {"random_init": True, "model_config": TINY_CLIP,
                    "templates": ["a photo of a {}.", "a blurry photo of the {}."]}},
    # dataset imagenet: its card's clean accuracy is skipped (no test split in the generated folder)
    {"name": "tiny_timm_random", "arch": "timm/resnet10t", "family": "timm", "dataset": "imagenet",
     "num_classes": 10, "pretrained": {"random_init": True}},
    {"name": "clip_offline", "arch": "open_clip/ViT-B-32", "family": "clip", "dataset": "cifar10",
     "pretrained": {"tag": "laion2b_s34b_b79k"}},
    {"name": "timm_offline", "arch": "timm/resnet18", "family": "timm", "dataset": "imagenet",
     "num_classes": 1000, "pretrained": {"tag": "tv_in1k"}},
]


@pytest.fixture
def zoo_dir(tmp_path, monkeypatch, cache_dir):
    """A zoo of the ci models plus the pretrained test entries above."""
    import os

    from advtransfer.core.resources import catalogue_dirs

    d = tmp_path / "zoo"
    d.mkdir()
    (d / "pretrained_test.yaml").write_text(yaml.safe_dump({"models": ENTRIES}))
    monkeypatch.setenv("ADVTRANSFER_ZOO", os.pathsep.join(map(str, [*catalogue_dirs(), d])))
    return d


def _capture_input(module: torch.nn.Module) -> list:
    seen = []
    module.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().clone()))
    return seen


def test_clip_zero_shot_victim_wiring(zoo_dir, test_data):
    import open_clip

    from advtransfer.data import CIFAR10_CLASSES
    from advtransfer.models import zoo

    torch.manual_seed(123)
    rng_before = torch.random.get_rng_state()
    model = zoo.load_model("tiny_clip_random")
    # building the model initialises weights at random, inside a fork of the global generator
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    x = test_data[0][:6]
    seen = _capture_input(model.visual)
    logits = model(x)
    assert logits.shape == (6, 10) and torch.isfinite(logits).all()
    # resized to the model's 64 px and normalised with CLIP's mean/std inside the wrapper
    cfg = model.visual.preprocess_cfg
    up = F.interpolate(x, size=(64, 64), mode="bicubic", align_corners=False)
    mean, std = torch.tensor(cfg["mean"]).view(1, 3, 1, 1), torch.tensor(cfg["std"]).view(1, 3, 1, 1)
    assert seen[0].shape == (6, 3, 64, 64)
    assert torch.allclose(seen[0], (up - mean) / std, atol=1e-5)
    # the zero-shot head: column c = normalised mean of the normalised text embeddings of class c
    torch.manual_seed(0)
    ref = open_clip.create_model("advtransfer-tiny-clip", pretrained=None).eval()
    tok = open_clip.get_tokenizer("advtransfer-tiny-clip")
    with torch.no_grad():
        e = F.normalize(ref.encode_text(tok([t.format(CIFAR10_CLASSES[3]) for t in ENTRIES[0]["pretrained"]["templates"]])), dim=-1)
        col = F.normalize(e.mean(0), dim=0)
        assert model.head.shape == (64, 10)
        assert torch.allclose(model.head[:, 3], col, atol=1e-5)
        f = F.normalize(ref.visual((up - mean) / std), dim=-1)
        assert torch.allclose(logits, ref.logit_scale.exp() * f @ model.head, atol=1e-4)
    # input gradients flow through the resize and the image tower (attacks need them)
    xg = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(model(xg)[:, 0].sum(), xg)
    assert torch.isfinite(g).all() and float(g.abs().sum()) > 0
    assert not any(p.requires_grad for p in model.parameters())


def test_timm_wrapper_applies_the_model_data_config(zoo_dir):
    import timm
    from PIL import Image

    from advtransfer.models import zoo

    rng_before = torch.random.get_rng_state()
    model = zoo.load_model("tiny_timm_random")
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    cfg = model.config
    assert cfg["input_size"] == (3, 176, 176) and cfg["crop_pct"] == 0.875
    # a 300×300 image: timm's own eval transform (PIL resize 201 + centre crop 176 + normalise)
    # against the wrapper's differentiable tensor version
    rng = np.random.default_rng(0)
    small = rng.integers(0, 256, (30, 30, 3), dtype=np.uint8)
    img = Image.fromarray(small).resize((300, 300), Image.BICUBIC)  # smooth content, like a photo
    ref = timm.data.create_transform(**cfg)(img).unsqueeze(0)
    x = torch.from_numpy(np.array(img)).permute(2, 0, 1).float().div(255).unsqueeze(0)
    seen = _capture_input(model.net)
    out = model(x)
    assert out.shape == (1, 10) and seen[0].shape == (1, 3, 176, 176)
    # PIL and torch bicubic differ slightly (rounding to uint8, kernel details): a wrong crop or
    # missing normalisation would differ by whole units
    assert float((seen[0] - ref).abs().mean()) < 0.05
    # 32×32 CIFAR images are upsampled to the same input size
    model(torch.rand(2, 3, 32, 32))
    assert seen[-1].shape == (2, 3, 176, 176)


@pytest.mark.parametrize("name", ["clip_offline", "timm_offline"])
def test_offline_without_weights_fails_with_one_line(zoo_dir, name):
    from advtransfer.models import zoo

    with pytest.raises(UserError) as err:
        zoo.load_model(name)
    msg = str(err.value)
    assert "\n" not in msg and name in msg and "weights:" in msg


def test_missing_weights_file_is_reported(zoo_dir, tmp_path):
    from advtransfer.models import zoo

    spec = zoo.get_spec("clip_offline")
    bad = replace(spec, origin=zoo.Origin("pretrained", {"pretrained": {"tag": "x", "weights": str(tmp_path / "nope.bin")}}))
    from advtransfer.models.pretrained import build_pretrained

    with pytest.raises(UserError, match="does not exist"):
        build_pretrained(bad)


def _write_images(root, layout: str) -> list[tuple[str, int, np.ndarray]]:
    """Six generated images of three classes, in class subfolders (by index or by wnid) or with a labels file."""
    from PIL import Image

    rng = np.random.default_rng(1)
    made = []
    sizes = [(40, 30), (30, 40), (64, 64), (50, 70), (33, 33), (80, 48)]
    wnids = ["n01440764", "n01443537", "n01484850"]
    for i, (w, h) in enumerate(sizes):
        label = i % 3
        arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        sub = {"index": str(label), "wnid": wnids[label], "labels": "imgs"}[layout]
        rel = f"{sub}/img{i}.png"
        (root / "val" / sub).mkdir(parents=True, exist_ok=True)
        Image.fromarray(arr).save(root / "val" / rel)
        made.append((rel, label, arr))
    if layout == "labels":
        (root / "val" / "labels.txt").write_text("".join(f"{rel} {label}\n" for rel, label, _ in made))
    return made


@pytest.mark.parametrize("layout", ["index", "wnid", "labels"])
def test_image_folder_source(tmp_path, layout):
    from PIL import Image

    from advtransfer.data import eval_subset, load_image_folder

    made = _write_images(tmp_path, layout)
    ds = load_image_folder(tmp_path, "val", size=24)
    assert len(ds) == 6
    x, y, idx = eval_subset(ds, 6)
    assert x.shape == (6, 3, 24, 24) and x.dtype == torch.float32 and 0 <= float(x.min()) <= float(x.max()) <= 1
    # every label and pixel matches its file (shorter side to 24, centre square)
    if layout != "labels":  # class subfolders are read round-robin over the classes
        assert y.tolist() == [0, 1, 2, 0, 1, 2]
    by_name = {rel.split("/")[-1]: (label, arr) for rel, label, arr in made}
    for j, f in enumerate(ds.x.files):
        label, arr = by_name[f.name]
        assert int(y[j]) == label
        im = Image.fromarray(arr)
        r = 24 / min(im.size)
        im = im.resize((max(24, round(im.size[0] * r)), max(24, round(im.size[1] * r))), Image.BICUBIC)
        l, t = (im.size[0] - 24) // 2, (im.size[1] - 24) // 2
        ref = np.array(im.crop((l, t, l + 24, t + 24)))
        assert torch.equal(x[j], torch.from_numpy(ref).permute(2, 0, 1).float() / 255)


def test_image_folder_errors(tmp_path):
    from advtransfer.data import load_image_folder

    with pytest.raises(UserError, match="does not exist"):
        load_image_folder(tmp_path, "val")
    (tmp_path / "val").mkdir()
    (tmp_path / "val" / "labels.txt").write_text("a.png cat\n")
    with pytest.raises(UserError, match="labels.txt:1"):
        load_image_folder(tmp_path, "val")


def test_imagenet_style_grid_with_random_init_models(tmp_path, zoo_dir, monkeypatch):
    """The whole ImageNet path offline: an image folder as the `imagenet` dataset, a timm model
    (random init, its own data config) as surrogate, a tiny CLIP zero-shot model as a victim."""
    from advtransfer.cli import main
    from advtransfer.run.store import RunStore

    _write_images(tmp_path / "imagenet", "index")
    monkeypatch.setenv("ADVTRANSFER_IMAGENET", str(tmp_path / "imagenet"))
    monkeypatch.setenv("ADVTRANSFER_IMAGE_SIZE", "48")
    grid = {"name": "folder_test", "dataset": "imagenet", "split": "val", "n": 6, "size": "ci", "batch_size": 6,
            "eps": ["16/255"], "attacks": {"ifgsm": {"steps": 2}},
            "surrogates": ["tiny_timm_random"], "victims": ["tiny_timm_random", "tiny_clip_random"]}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    out = tmp_path / "run"
    assert main(["grid", str(path), "--out", str(out), "--no-progress", "--no-plot"]) == 0
    df = RunStore(out).read_results()
    assert sorted(df["victim"]) == ["tiny_clip_random", "tiny_timm_random"]
    assert (df["n"] == 6).all() and (df["linf_max"] <= 16 / 255 + 1e-6).all()
    assert set(df["victim_family"]) == {"timm", "clip"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["zoo"]["tiny_clip_random"]["kind"] == "random_init"


def test_zoo_cli_lists_pretrained_entries_and_a_named_offline_one_fails(zoo_dir, capsys):
    from advtransfer.cli import main

    assert main(["zoo", "list", "--size", "ci"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("clip_offline"))
    assert "pretrained laion2b_s34b_b79k" in line and "not loaded yet" in line
    # naming an offline pretrained entry fails with exit code 2 and one line on stderr
    assert main(["zoo", "train", "clip_offline", "--size", "ci"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("advtransfer: error:") and "\n" not in err
