"""Input-transformation defences and randomized smoothing, as wrappers of any zoo model.

A victim entry declares one on a base entry (``victims/defended.yaml``)::

    - name: resnet20_b_jpeg
      base: resnet20_b
      family: defended
      defence: {kind: jpeg, quality: 75}

The wrapped model takes pixels in [0,1] (N×3×H×W) like every zoo model and returns scores whose
argmax is its label, except where :meth:`Defended.decide` says otherwise (randomized smoothing
abstains: label :data:`ABSTAIN`). Kinds:

- ``jpeg`` (``quality`` 1..100): JPEG encode/decode of the 8-bit image (Dziugaite et al. 2016;
  Guo et al. 2018).
- ``bit_depth`` (``bits`` 1..8): each channel rounded to 2^bits levels (feature squeezing, Xu
  et al. 2018).
- ``median`` (``size`` odd ≥ 3): k×k median filter per channel, reflect padding (Xu et al. 2018).
- ``resize_pad`` (``min_size``): random resizing and padding (Xie et al. 2018), adapted to
  32×32 inputs: each image is resized to a random side r ∈ [min_size, H] and zero-padded back to
  H×W at a random offset. Stochastic.
- ``smoothing`` (``sigma`` in pixel units, ``n`` noise draws, ``alpha``): randomized smoothing's
  PREDICT (Cohen et al. 2019): the base labels n Gaussian-noised copies, the top class wins if a
  two-sided binomial test of its count against the runner-up's rejects equality at ``alpha``;
  otherwise the model abstains. Scores are vote fractions. Stochastic.

Stochastic defences draw their randomness per image from (``seed``, draw index, the image's
bytes): the same image always gets the same randomness in the same draw, whatever batch it is
in, so results reproduce exactly. An entry's ``draws`` (default 1 for deterministic kinds, 4 for
stochastic ones) is how many independent draws the evaluation makes; set :attr:`Defended.draw`
to choose one.

Gradients (when a defended model is attacked as a surrogate): JPEG and bit-depth pass the
gradient straight through (BPDA, Athalye et al. 2018); median and resize are differentiable;
smoothing's scores carry the gradient of the mean softmax over its noisy copies.
"""
from __future__ import annotations

import hashlib
import struct
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core.errors import UserError
from ..core.metrics import ABSTAIN


#: code version of each kind: enters the entry's identity (bump when a kind's output changes)
VERSIONS = {"jpeg": 1, "bit_depth": 1, "median": 1, "resize_pad": 1, "smoothing": 1}
STOCHASTIC = {"resize_pad", "smoothing"}
_PARAMS: dict[str, dict[str, Any]] = {  # allowed parameters and their defaults
    "jpeg": {"quality": 75},
    "bit_depth": {"bits": 4},
    "median": {"size": 3},
    "resize_pad": {"min_size": 28, "seed": 0, "draws": 4},
    "smoothing": {"sigma": 0.25, "n": 100, "alpha": 0.001, "seed": 0, "draws": 1, "batch": 1000},
}


def resolve(defence: Any, where: str = "") -> dict[str, Any]:
    """The defence mapping with defaults filled in and checked (one-line UserError otherwise)."""
    if not isinstance(defence, dict) or "kind" not in defence:
        raise UserError(f"{where}: defence must be a mapping with a kind ({', '.join(_PARAMS)})")
    kind = defence["kind"]
    if kind not in _PARAMS:
        from ..core.registry import suggest

        raise UserError(f"{where}: " + suggest(str(kind), list(_PARAMS), "defence"))
    extra = set(defence) - set(_PARAMS[kind]) - {"kind", "draws"}
    if extra:
        raise UserError(f"{where}: defence {kind!r} has unknown keys {sorted(extra)}; allowed: "
                        f"{sorted(set(_PARAMS[kind]) | {'draws'})}")
    out = {"kind": kind, "draws": 1, **_PARAMS[kind], **{k: v for k, v in defence.items() if k != "kind"}}

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise UserError(f"{where}: defence {kind!r}: {what}")

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    need(is_int(out["draws"]) and out["draws"] >= 1, f"draws must be a positive integer, got {out['draws']!r}")
    need(kind in STOCHASTIC or out["draws"] == 1, "a deterministic defence has draws: 1")
    if kind == "jpeg":
        need(is_int(out["quality"]) and 1 <= out["quality"] <= 100, f"quality must be an integer in 1..100, got {out['quality']!r}")
    elif kind == "bit_depth":
        need(is_int(out["bits"]) and 1 <= out["bits"] <= 8, f"bits must be an integer in 1..8, got {out['bits']!r}")
    elif kind == "median":
        need(is_int(out["size"]) and out["size"] >= 3 and out["size"] % 2 == 1, f"size must be an odd integer >= 3, got {out['size']!r}")
    elif kind == "resize_pad":
        need(is_int(out["min_size"]) and out["min_size"] >= 8, f"min_size must be an integer >= 8, got {out['min_size']!r}")
    elif kind == "smoothing":
        need(isinstance(out["sigma"], (int, float)) and out["sigma"] > 0, f"sigma must be > 0 (pixel units), got {out['sigma']!r}")
        need(is_int(out["n"]) and out["n"] >= 2, f"n must be an integer >= 2, got {out['n']!r}")
        need(isinstance(out["alpha"], float) and 0 < out["alpha"] < 1, f"alpha must be in (0, 1), got {out['alpha']!r}")
        need(is_int(out["batch"]) and out["batch"] >= 1, f"batch must be a positive integer, got {out['batch']!r}")
    if kind in STOCHASTIC:
        need(is_int(out["seed"]), f"seed must be an integer, got {out['seed']!r}")
    return out


def identity(defence: dict[str, Any]) -> dict[str, Any]:
    """What determines the defence's outputs (hashed into the entry's identity): its resolved
    parameters (``batch`` left out: it changes speed, not results) and its code version."""
    d = {k: v for k, v in defence.items() if k != "batch"}
    return {**d, "version": VERSIONS[defence["kind"]]}


def image_seeds(x: torch.Tensor, seed: int, draw: int) -> list[int]:
    """One 63-bit seed per image of ``x`` (N×C×H×W) from its float32 bytes, ``seed`` and ``draw``."""
    a = x.detach().to("cpu", torch.float32).contiguous().numpy()
    tail = struct.pack("<qq", int(seed), int(draw))
    return [int.from_bytes(hashlib.blake2b(a[i].tobytes() + tail, digest_size=8).digest(), "little") >> 1
            for i in range(len(a))]


def _straight_through(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``y`` in value, identity in gradient (BPDA)."""
    return x + (y - x).detach()


def jpeg(x: torch.Tensor, quality: int) -> torch.Tensor:
    """JPEG round trip of pixels in [0,1] (N×3×H×W) at ``quality``: 8-bit quantisation, encode,
    decode (Pillow's libjpeg, 4:2:0 chroma subsampling, its default); returns pixels in [0,1] on
    ``x``'s device."""
    import io

    from PIL import Image

    q = (x.detach().clamp(0, 1) * 255).round().to("cpu", torch.uint8).permute(0, 2, 3, 1).numpy()
    out = []
    for img in q:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=int(quality))
        buf.seek(0)
        out.append(np.asarray(Image.open(buf).convert("RGB")))
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).to(x.device, x.dtype) / 255


def bit_depth(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Each value rounded to the nearest of 2^bits levels in [0,1]."""
    levels = 2 ** int(bits) - 1
    return torch.round(x.clamp(0, 1) * levels) / levels


def median(x: torch.Tensor, size: int) -> torch.Tensor:
    """k×k median filter per channel (reflect padding); k odd, so the median is an element."""
    n, c, h, w = x.shape
    p = size // 2
    patches = F.unfold(F.pad(x, (p, p, p, p), mode="reflect").reshape(n * c, 1, h + 2 * p, w + 2 * p), size)
    return patches.median(dim=1).values.reshape(n, c, h, w)


def resize_pad(x: torch.Tensor, min_size: int, seeds: list[int]) -> torch.Tensor:
    """Per image: resize to a random side r ∈ [min_size, H] (bilinear), zero-pad to H×W at a
    random offset; image i draws r and the offset from ``seeds[i]``."""
    n, c, h, w = x.shape
    lo = min(int(min_size), h)
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(seeds[i])
        r = int(torch.randint(lo, h + 1, (1,), generator=g))
        top = int(torch.randint(0, h - r + 1, (1,), generator=g))
        left = int(torch.randint(0, w - r + 1, (1,), generator=g))
        xi = F.interpolate(x[i:i + 1], size=(r, r), mode="bilinear", align_corners=False) if r != h else x[i:i + 1]
        out.append(F.pad(xi, (left, w - r - left, top, h - r - top)))
    return torch.cat(out)


def binomial_p(n_a: np.ndarray, n_b: np.ndarray) -> np.ndarray:
    """Two-sided exact binomial p-values of n_a successes in n_a + n_b trials at p = 1/2 (n_a ≥ n_b)."""
    from scipy.stats import binom

    n = n_a + n_b
    return np.minimum(1.0, 2 * binom.sf(n_a - 1, n, 0.5))


class Defended(nn.Module):
    """A zoo model behind a defence: ``base`` takes pixels in [0,1]; ``defence`` is a resolved
    mapping (:func:`resolve`). :attr:`draw` selects the stochastic draw (0..draws-1)."""

    def __init__(self, base: nn.Module, defence: dict[str, Any]) -> None:
        super().__init__()
        self.base = base
        self.defence = dict(defence)
        self.kind = defence["kind"]
        self.stochastic = self.kind in STOCHASTIC
        self.draws = int(defence.get("draws", 1))
        self.draw = 0

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """The defence's input transformation (not for smoothing, which votes)."""
        d = self.defence
        if self.kind == "jpeg":
            return _straight_through(x, jpeg(x, d["quality"]))
        if self.kind == "bit_depth":
            return _straight_through(x, bit_depth(x, d["bits"]))
        if self.kind == "median":
            return median(x, d["size"])
        if self.kind == "resize_pad":
            return resize_pad(x, d["min_size"], image_seeds(x, d["seed"], self.draw))
        raise ValueError(self.kind)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "smoothing":
            return self._smoothed(x)
        return self.base(self.transform(x))

    def _smoothed(self, x: torch.Tensor) -> torch.Tensor:
        d = self.defence
        n, sigma = int(d["n"]), float(d["sigma"])
        seeds = image_seeds(x, d["seed"], self.draw)
        per = max(1, int(d["batch"]) // n)  # images per base forward pass
        scores = []
        for s in range(0, len(x), per):
            xb = x[s:s + per]
            noise = torch.cat([torch.randn((n, *xb.shape[1:]), generator=torch.Generator().manual_seed(seeds[s + i]))
                               for i in range(len(xb))]).to(x.device, x.dtype)
            noisy = xb.repeat_interleave(n, dim=0) + sigma * noise  # Cohen et al.: no clipping
            logits = self.base(noisy)
            k = logits.shape[1]
            votes = F.one_hot(logits.argmax(1), k).to(x.dtype).view(len(xb), n, k).mean(1)
            soft = logits.softmax(1).view(len(xb), n, k).mean(1)
            scores.append(votes + (soft - soft.detach()))
        return torch.cat(scores)

    def decide(self, scores: torch.Tensor) -> torch.Tensor:
        """Labels from scores; randomized smoothing abstains (:data:`ABSTAIN`) where the top
        class's vote count is not significantly above the runner-up's at ``alpha``."""
        top = scores.argmax(1)
        if self.kind != "smoothing":
            return top
        n = int(self.defence["n"])
        counts = (scores.detach().float().cpu() * n).round().to(torch.int64)
        two = counts.topk(2, dim=1).values.numpy()
        p = binomial_p(two[:, 0], two[:, 1])
        out = top.clone()
        out[torch.as_tensor(p > float(self.defence["alpha"]), device=out.device)] = ABSTAIN
        return out


def draws_of(model: nn.Module) -> int:
    """How many stochastic draws the evaluation makes of ``model`` (1 unless a stochastic defence)."""
    return int(getattr(model, "draws", 1)) if getattr(model, "stochastic", False) else 1
