"""Weights on the Hugging Face Hub: ``hf-hub:<owner>/<repo>[@<revision>]/<path in the repo>``.

Two places take such a reference:

- a shipped model's card (``zoo/<size>/<name>.json``) may carry ``"weights_hub"``: when the
  safetensors file beside the card is absent (a clone without the weights), the file is fetched
  from the Hub and must match the card's ``sha256`` before it is loaded;
- a catalogue entry's ``pretrained: {weights: "hf-hub:...", sha256: <hex>}`` (the user's own
  weights for a registered architecture); ``sha256`` is optional but recommended, the file is
  checked against it when given.

Downloads go through :func:`huggingface_hub.hf_hub_download` into the Hub's own cache
(``$HF_HUB_CACHE``, read at each call, else huggingface_hub's default), so ``HF_HUB_OFFLINE=1``
with the file cached works without a network. ``@<revision>`` pins a branch, tag or commit (a
commit hash pins the bytes; the sha256 check pins them whatever the revision).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import UserError
from ..core.utils import sha256_file

PREFIX = "hf-hub:"


@dataclass(frozen=True)
class HubRef:
    """A file in a Hub model repository."""

    repo_id: str
    filename: str
    revision: str | None = None

    def __str__(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        return f"{PREFIX}{self.repo_id}{rev}/{self.filename}"


def is_hub_ref(ref: object) -> bool:
    return isinstance(ref, str) and ref.startswith(PREFIX)


def parse_hub_ref(ref: str) -> HubRef:
    """``hf-hub:owner/repo[@revision]/path/file.safetensors`` → :class:`HubRef`; UserError when
    the text is not of that form."""
    if not is_hub_ref(ref):
        raise UserError(f"{ref!r} is not a Hub reference (hf-hub:<owner>/<repo>[@<revision>]/<file>)")
    parts = ref[len(PREFIX):].split("/")
    if len(parts) < 3 or not all(parts):
        raise UserError(f"Hub reference {ref!r} must be hf-hub:<owner>/<repo>[@<revision>]/<path of the file in "
                        "the repo>, e.g. hf-hub:me/cifar-zoo@v1/resnet20_a.safetensors")
    owner, repo_rev, path = parts[0], parts[1], "/".join(parts[2:])
    repo, _, revision = repo_rev.partition("@")
    if not repo:
        raise UserError(f"Hub reference {ref!r} names no repository")
    return HubRef(f"{owner}/{repo}", path, revision or None)


def hub_file(ref: str, sha256: str | None = None, what: str = "weights") -> Path:
    """The local path of the Hub file ``ref`` (downloaded into the Hub cache if needed), checked
    against ``sha256`` (hex) when given. One-line UserError when it cannot be fetched (offline and
    not cached, no such repository or file) or does not match."""
    r = parse_hub_ref(ref)
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:  # pragma: no cover - timm depends on it
        raise UserError(f"{what} {ref}: needs the huggingface_hub package (pip install huggingface_hub)") from None
    cache = os.environ.get("HF_HUB_CACHE") or None
    try:
        path = Path(hf_hub_download(r.repo_id, r.filename, revision=r.revision, cache_dir=cache))
    except Exception as exc:  # noqa: BLE001 - offline, missing repo/file, HTTP errors: one line each
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise UserError(f"{what} {ref}: cannot fetch it from the Hugging Face Hub ({type(exc).__name__}: {first}); "
                        "connect to the internet once, or put the file in the Hub cache "
                        "($HF_HUB_CACHE) and set HF_HUB_OFFLINE=1") from None
    if sha256 and sha256_file(path) != sha256:
        raise UserError(f"{what} {ref}: the file fetched ({path}) does not match the sha256 {sha256[:12]}... it "
                        "must have; the repository changed or the cache is damaged (pin a commit with @<revision>, "
                        "or delete the cached file)")
    return path
