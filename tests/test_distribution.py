"""Distribution conventions: CITATION.cff, zoo cards rendered as Hugging Face model cards with the
weights laid out for a Hub repository, and weights fetched from the Hub (``hf-hub:``), tested
offline against a Hub cache the test writes (the layout huggingface_hub itself reads)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

import advtransfer
from advtransfer.core.errors import UserError
from advtransfer.core.utils import sha256_file, temp_env

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "zoo" / "converged"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_citation_file_names_this_version():
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["version"] == advtransfer.__version__
    assert cff["title"] and cff["authors"] and cff["license"] == "MIT" and cff["type"] == "software"


def test_hf_model_card_and_export(tmp_path):
    """The Hub card's front matter is YAML with the card's measured accuracies; the exported
    weights are the shipped file byte for byte."""
    from advtransfer.models.hfcard import export_hf, hf_model_card

    card = json.loads((SHIPPED / "resnet20_at.json").read_text())
    text = hf_model_card(card)
    assert text.startswith("---\n")
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["library_name"] == "advtransfer" and front["datasets"] == ["uoft-cs/cifar10"]
    metrics = front["model-index"][0]["results"][0]["metrics"]
    assert [m["value"] for m in metrics] == [round(card["clean_acc"], 4), round(card["robust_acc_pgd20"], 4)]
    assert card["sha256"] in text and "advtransfer.load_model('resnet20_at'" in text
    (folder,) = export_hf(["resnet20_at"], "converged", tmp_path)
    assert sha256_file(folder / "model.safetensors") == card["sha256"]
    assert json.loads((folder / "advtransfer.json").read_text()) == card
    assert (folder / "README.md").read_text() == text
    with pytest.raises(UserError, match="not trained at size"):
        export_hf(["resnet20_b@r7"], "converged", tmp_path)


def _hub_cache(root: Path, repo: str, files: dict[str, Path]) -> Path:
    """A Hugging Face Hub cache holding ``files`` (name in repo -> local file) of model ``repo`` at
    one commit, its main branch pointing there (the layout hf_hub_download reads offline)."""
    base = root / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / COMMIT
    for name, src in files.items():
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, snap / name)
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(COMMIT)
    return root


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    import huggingface_hub.constants as hc

    cache = _hub_cache(tmp_path / "hub", "me/cifar-zoo", {"at/resnet20_at.safetensors": SHIPPED / "resnet20_at.safetensors"})
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    with temp_env(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1"):
        yield cache


def test_hub_references_parse_and_fetch_offline(offline_hub):
    from advtransfer.models.hub import hub_file, parse_hub_ref

    r = parse_hub_ref("hf-hub:me/cifar-zoo@v1/at/resnet20_at.safetensors")
    assert (r.repo_id, r.revision, r.filename) == ("me/cifar-zoo", "v1", "at/resnet20_at.safetensors")
    assert str(r) == "hf-hub:me/cifar-zoo@v1/at/resnet20_at.safetensors"
    for bad in ("hf-hub:me/resnet.safetensors", "hf-hub:me//x.pt", "me/cifar-zoo/x.pt"):
        with pytest.raises(UserError):
            parse_hub_ref(bad)
    sha = sha256_file(SHIPPED / "resnet20_at.safetensors")
    for rev in ("", f"@{COMMIT}"):  # the main branch, and a pinned commit
        path = hub_file(f"hf-hub:me/cifar-zoo{rev}/at/resnet20_at.safetensors", sha)
        assert sha256_file(path) == sha and str(offline_hub) in str(path)
    with pytest.raises(UserError, match="does not match the sha256"):
        hub_file("hf-hub:me/cifar-zoo/at/resnet20_at.safetensors", "0" * 64)
    with pytest.raises(UserError, match="cannot fetch it from the Hugging Face Hub") as exc:
        hub_file("hf-hub:me/cifar-zoo/at/missing.safetensors")
    assert "\n" not in str(exc.value)


def test_a_shipped_card_with_weights_on_the_hub(offline_hub, tmp_path):
    """A clone without the weights file: the card's weights_hub is fetched, checked against the
    card's sha256, and gives the network the shipped file gives."""
    from advtransfer.models import zoo

    ship = tmp_path / "shipped" / "converged"
    ship.mkdir(parents=True)
    card = json.loads((SHIPPED / "resnet20_at.json").read_text())
    card["weights_hub"] = "hf-hub:me/cifar-zoo/at/resnet20_at.safetensors"
    (ship / "resnet20_at.json").write_text(json.dumps(card))
    x = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = zoo.load_model("resnet20_at", "converged")(x)
    with temp_env(ADVTRANSFER_SHIPPED_ZOO=str(tmp_path / "shipped")):
        with torch.no_grad():
            got = zoo.load_model("resnet20_at", "converged")(x)
        assert torch.equal(got, ref)
        card["sha256"] = "f" * 64  # a card that disagrees with the Hub's file: refused, never loaded
        (ship / "resnet20_at.json").write_text(json.dumps(card))
        with pytest.raises(UserError, match="does not match the sha256"):
            zoo.load_model("resnet20_at", "converged")


def test_a_catalogue_entry_with_hub_weights(offline_hub, tmp_path):
    """The user's own weights for a registered architecture, named on the Hub with their sha256."""
    from advtransfer.models import zoo
    from advtransfer.plugins import _unload, load_plugins

    sha = sha256_file(SHIPPED / "resnet20_at.safetensors")

    def entry(**pre) -> Path:
        path = tmp_path / f"hub{len(list(tmp_path.glob('hub*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump({"models": [{"name": "hub_at", "arch": "resnet", "arch_kwargs": {"depth": 20},
                                                    "family": "defended", "pretrained": pre}]}))
        return path

    plug = load_plugins([str(entry(weights="hf-hub:me/cifar-zoo/at/resnet20_at.safetensors", sha256=sha))])
    try:
        x = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
        zoo.ensure_trained(["hub_at"], "converged", progress=False, log=lambda *_: None)
        with torch.no_grad():
            # the same weights in another wrapper (the registered-architecture path): equal to rounding
            mine, shipped = zoo.load_model("hub_at", "converged")(x), zoo.load_model("resnet20_at", "converged")(x)
            assert torch.allclose(mine, shipped, atol=1e-5) and torch.equal(mine.argmax(1), shipped.argmax(1))
    finally:
        for p in plug:
            _unload(p)
    with pytest.raises(UserError, match="sha256 must be 64 lowercase hex"):
        load_plugins([str(entry(weights="hf-hub:me/cifar-zoo/at/resnet20_at.safetensors", sha256="abc"))])
    with pytest.raises(UserError, match="must be hf-hub:<owner>/<repo>"):
        load_plugins([str(entry(weights="hf-hub:me/resnet20_at.safetensors"))])


def test_zoo_export_command(tmp_path, capsys):
    from advtransfer.cli import main

    assert main(["zoo", "export", "resnet20_at", "resnet20_a", "--size", "converged", "--out", str(tmp_path / "hub")]) == 0
    for name in ("resnet20_at", "resnet20_a"):
        card = json.loads((SHIPPED / f"{name}.json").read_text())
        assert sha256_file(tmp_path / "hub" / name / "model.safetensors") == card["sha256"]
        assert (tmp_path / "hub" / name / "README.md").read_text().startswith("---\nlicense: mit\n")
    capsys.readouterr()
    # an unknown or untrained name: one line, exit 2, nothing written
    for bad in ("resnet99", "resnet20_b@r7"):
        assert main(["zoo", "export", "resnet20_a", bad, "--size", "converged", "--out", str(tmp_path / "none")]) == 2
    assert main(["zoo", "export", "resnet20_a", "--size", "full", "--out", str(tmp_path / "none")]) == 2  # never trained at full here
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "resnet99" in err[0] and "replicate" in err[1] and "not trained at size 'full'" in err[2]
    assert not (tmp_path / "none").exists()
