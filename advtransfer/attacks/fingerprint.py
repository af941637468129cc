"""Output fingerprints of the registered attacks on a fixed tiny input.

An attack's ``version`` enters every cell id, so examples crafted by older code are never reused;
that only works if the version is bumped whenever the output changes. ``tests/test_attack_versions.py``
compares each attack's fingerprint with the one recorded beside its version in
``tests/attack_fingerprints.json``: a changed output under an unchanged version fails the suite.

After an intended change: bump the attack's ``version`` in its ``register_attack`` line, then

    python -m advtransfer.attacks.fingerprint --update tests/attack_fingerprints.json

The input: two small randomly initialised conv nets (fixed seeds, float64) and 6 random images
3×32×32 in [0,1]; each attack runs 2 steps at ε = 8/255 (universal attacks: δ crafted on the 6
images, 3 per update). The fingerprint hashes x_adv rounded to 2⁻³⁰.

Float64 does not make the output bit-identical on every machine: another CPU's kernels (oneDNN's
ISA, ATen's vectorised transcendentals) round the last bits differently, and an attack that trains
a generator with Adam carries that noise to ~1e-10 in x_adv, enough to cross a 2⁻³⁰ rounding
boundary: on another machine's default kernels the generative attacks' hashes change while their
x_adv moves only by float noise. So each attack also records a :func:`sketch` of its
perturbation, 64 seeded random projections of x_adv − x, and the version test accepts a changed
hash when the sketch moved by at most ``SKETCH_TOL`` = 1e-7, orders of magnitude above what float
noise moves it and below what a 1% change of a step size or learning rate moves it (the
measurements: results/notes/settings-measurements.md).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path

import torch
import torch.nn as nn

from . import ATTACKS, SurrogateSet, create_attack

#: per-attack parameters that keep the fingerprint cheap (and exercise the attack's own options)
SMALL = {"vmifgsm": {"n_samples": 3}, "svre": {"inner_steps": 2},
         "sgd_uap": {"n_craft": 6, "batch": 3}, "xtransfer_uap": {"n_craft": 6, "batch": 3, "k": 1},
         "sim": {"n_scales": 3}, "ssa": {"n_copies": 3}, "bsr": {"n_copies": 3},
         "admix": {"n_scales": 2, "n_mix": 2, "n_pool": 100},
         "ila": {"base_steps": 2}, "fia": {"n_ens": 3}, "naa": {"n_ens": 3},
         "pas": {"gammas": [0.5, 0.8, 1.0], "deltas": [0.5, 1.0, 0.75]}}
#: generative attacks: a narrow generator trained 2 updates on the 6 images, 3 per update
_GEN = {"n_craft": 6, "batch": 3, "width": 4, "blocks": 1}
SMALL.update({n: dict(_GEN) for n in ("cda", "bia", "facl", "cgnc", "dual_flow")})
SMALL["dual_flow"]["flow_steps"] = 2
SMALL["pdcl"] = {**_GEN, "clip": "tiny", "prompt_steps": 2}


class TinyClip(nn.Module):
    """A float64 stand-in for a CLIP model with a text tower (what PDCL calls): image embeddings
    from pooled pixels, prompt text embeddings from the context's mean plus a class vector."""

    def __init__(self, seed: int = 7, dim: int = 8, width: int = 6, classes: int = 10) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.img = nn.Parameter(torch.randn(3 * 16, dim, generator=g, dtype=torch.float64), requires_grad=False)
        self.txt = nn.Parameter(torch.randn(width, dim, generator=g, dtype=torch.float64), requires_grad=False)
        self.cls = nn.Parameter(torch.randn(classes, dim, generator=g, dtype=torch.float64), requires_grad=False)
        self.width, self.has_text, self.logit_scale = width, True, 10.0
        self.register_buffer("head", nn.functional.normalize(self.cls, dim=1).T.clone())

    def encode_image(self, x: torch.Tensor) -> torch.Tensor:
        f = nn.functional.adaptive_avg_pool2d(x, 4).flatten(1).to(self.img.dtype) @ self.img
        return nn.functional.normalize(f, dim=-1)

    def context_init(self, n_ctx: int) -> torch.Tensor:
        return torch.full((n_ctx, self.width), 0.1, dtype=torch.float64)

    def prompt_text_features(self, ctx: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(ctx.mean(0) @ self.txt + self.cls, dim=-1)

#: attacks that need model structure the plain tiny nets lack get tiny residual nets instead
RESIDUAL = {"pas"}
#: ... and those whose default form leaves the first block of a stage alone (SGM) or renormalises
#: residual branches (LinBP) get three blocks, the second one neither first of its stage nor downsampling
DEEP_RESIDUAL = {"sgm", "linbp"}
INPUTS = ("plain", "residual", "deep")


def _tiny_net(seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 8, 3, stride=2, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 10)).double()
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
    return net.eval()


class _Block(nn.Module):
    """A basic residual block (conv-BN-ReLU-conv-BN plus the skip path, then ReLU), shaped like the
    zoo's (:class:`advtransfer.models.archs._BasicBlock`: the surgery attacks find blocks by these
    attribute names) but written here, since the attack layer runs on core/ and data/ only; its
    skip projection has no BatchNorm, and changing that would change every recorded fingerprint."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None if stride == 1 and cin == cout else nn.Conv2d(cin, cout, 1, stride, bias=False)
        self.act1, self.act2 = nn.ReLU(), nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(self.act1(self.bn1(self.conv1(x)))))
        return self.act2(out + (x if self.short is None else self.short(x)))


def _tiny_res_net(seed: int, deep: bool = False) -> nn.Module:
    """A conv stem, two residual blocks (one downsampling; ``deep``: three, the middle one keeping
    width and resolution) and a linear head."""
    g = torch.Generator().manual_seed(seed)
    blocks = [_Block(6, 6, 1)] + ([_Block(6, 6, 1)] if deep else []) + [_Block(6, 8, 2)]
    net = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), *blocks,
                        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 10)).double()
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
    return net.eval()


def fixed_input(residual: bool = False, deep: bool = False) -> tuple[list[nn.Module], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two tiny float64 models (with two residual blocks if ``residual``, three if ``deep``), 6
    images (float64 in [0,1]), labels and dataset indices."""
    g = torch.Generator().manual_seed(12345)
    x = torch.rand(6, 3, 32, 32, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3, 4, 5])
    if deep:
        return [_tiny_res_net(1, deep=True), _tiny_res_net(2, deep=True)], x, y, torch.arange(100, 106)
    build = _tiny_res_net if residual else _tiny_net
    return [build(1), build(2)], x, y, torch.arange(100, 106)


def default_inputs(name: str) -> str:
    """Which of :data:`INPUTS` attack ``name`` is fingerprinted on."""
    return "deep" if name in DEEP_RESIDUAL else "residual" if name in RESIDUAL else "plain"


def output(name: str, params: dict | None = None, inputs: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_adv, x): attack ``name``'s output on :func:`fixed_input` (float64, shape (6, 3, 32, 32),
    pixels in [0,1]) and its clean input, computed with one thread (restored afterwards).
    ``params`` are added to the attack's :data:`SMALL` settings and ``inputs`` (one of
    :data:`INPUTS`) replaces :func:`default_inputs`: how an earlier version's fingerprint is
    reproduced by an option that keeps its form."""
    inputs = inputs or default_inputs(name)
    if inputs not in INPUTS:
        raise ValueError(f"inputs must be one of {INPUTS}, got {inputs!r}")
    models, x, y, index = fixed_input(residual=inputs == "residual", deep=inputs == "deep")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        atk = create_attack(name, eps=8 / 255, steps=2, **{**SMALL.get(name, {}), **(params or {})})
        if SMALL.get(name, {}).get("clip"):
            atk.clip_model = TinyClip()
        # targeted attacks (the multi-target generators) aim at the next class
        x_adv = atk(SurrogateSet(models), x, (y + 1) % 10 if atk.targeted else y, index, y_true=y)
    finally:
        torch.set_num_threads(threads)
    return x_adv.double(), x


def hash_of(x_adv: torch.Tensor) -> str:
    """sha256 (first 16 hex digits) of ``x_adv`` rounded to 2⁻³⁰."""
    q = torch.round(x_adv.double() * 2 ** 30).to(torch.int64)
    return hashlib.sha256(q.numpy().tobytes()).hexdigest()[:16]


#: projections in a sketch, and the largest change of one that counts as float noise (module docstring)
SKETCH_DIM = 64
SKETCH_TOL = 1e-7


def sketch(x_adv: torch.Tensor, x: torch.Tensor) -> list[float]:
    """64 seeded Gaussian projections of the perturbation x_adv − x (flattened, n elements),
    each divided by √n, so one projection moves by about the size of a typical element's change."""
    d = (x_adv.double() - x.double()).flatten()
    g = torch.Generator().manual_seed(2024)
    proj = torch.randn(SKETCH_DIM, d.numel(), generator=g, dtype=torch.float64)
    return [float(v) for v in (proj @ d) / d.numel() ** 0.5]


def same_output(a: list[float], b: list[float], tol: float = SKETCH_TOL) -> tuple[bool, float]:
    """Whether two sketches are one output up to float noise, and their largest difference."""
    if len(a) != len(b):
        return False, float("inf")
    gap = max(abs(u - v) for u, v in zip(a, b))
    return gap <= tol, gap


def fingerprint(name: str, params: dict | None = None, inputs: str | None = None) -> str:
    """sha256 (first 16 hex digits) of attack ``name``'s :func:`output` rounded to 2⁻³⁰."""
    return hash_of(output(name, params, inputs)[0])


def record(name: str) -> dict:
    """{"version", "fingerprint", "sketch"} of attack ``name`` as the version test compares them."""
    x_adv, x = output(name)
    return {"version": ATTACKS.get(name).version, "fingerprint": hash_of(x_adv), "sketch": sketch(x_adv, x)}


def current() -> dict[str, dict]:
    """{attack: :func:`record`} for every registered attack."""
    return {n: record(n) for n in ATTACKS.names()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--update", metavar="JSON", help="write the current fingerprints to this file")
    args = ap.parse_args(argv)
    table = current()
    # one line per sketch: a list of numbers collapsed onto its key's line
    text = re.sub(r"\[\s+([^\[\]]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]",
                  json.dumps(table, indent=1, sort_keys=True))
    if args.update:
        Path(args.update).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
