"""The attacks of other libraries as grid attacks: ``torchattack:<Name>`` (torchattack, the
``ATTACK_REGISTRY`` of the PyPI package) and ``torchattacks:<Name>`` (the classes torchattacks
exports), e.g. ``torchattack:MIFGSM``, ``torchattacks:VMIFGSM``.

A name is resolved on first use (:meth:`advtransfer.core.registry.Registry.add_resolver`): the library
is imported then, and its class becomes a registered attack of kind ``gradient`` whose parameters
are the class's own, read from its signature (names and defaults; unknown names are refused with
close matches). The harness sets ``eps`` (``max_epsilon`` in torchattacks' PI-FGSM), ``steps``
(``num_iter_set``, ``nb_iter``), ``alpha`` (where the library has one; default: the library's
number, else ε/steps, as the library does), ``targeted``, ``norm`` and ``seed`` where the class
takes them, the class count (``num_classes``/``n_classes``, from the surrogates' logits) and the
device; a library parameter named like a common harness one (``loss``) is given as ``lib_loss``.

What the library gets: a module taking pixels in [0,1] (N×3×H×W; the zoo models normalise
inside, so the library's ``normalize`` is the identity) that returns the weighted logit ensemble
of the surrogate set (a deep copy per batch: libraries that hook or replace layers never change
the surrogates). Every backward pass that reaches the module's input or leaves its logits is
counted per image it carries (a pass on N·k stacked copies of N images costs k per image, times
the members), so ``grad_evals`` in the rows and ``matched: [step, evals]`` baselines count what
the library really spent; ``grad_evals_formula`` (matched baselines, budgets, dry runs) is
measured once per parameter set by running the attack on a tiny stand-in network.

Randomness: neither library takes a generator, so by default (``rng: batch``) torch's, numpy's
and Python's global generators are seeded per crafting batch from the attack seed and the batch's
dataset indices (and restored afterwards): results are reproducible for a given batch size, but
an image's perturbation depends on its batch: the grid's ``batch_size`` then enters the cell id
(another batch size is another cell) and the crafting batch is never halved on out-of-memory
(the error says to lower it). ``rng: image`` runs each image alone, seeded from (seed, its
index): independent of batching, and slower. The mode is recorded in the row's
``attack_params``, with the library's name and version (``library``), so both enter the cell id.

Refused with one line (``advtransfer attacks`` lists them): generative attacks (pretrained
ImageNet generators downloaded at run time), attacks hooking timm ViT or torchvision
ResNet/DenseNet module names, attacks not bounded by ε (DeepFool, CW, JSMA, EAD, OnePixel,
Pixle, SparseFool, noise), downloads, hard-coded CUDA or 224×224 images on other images, and a
port that does not do what its attack does in the installed version (torchattack 1.7.2's MIG).
Library attacks take the logit ensemble of plain models (no LGV/SWAG/cSGLD collections) and their
own loss (``loss: ce``).
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import importlib.util
import inspect
import json
import math
import random
import warnings
from typing import Any, Callable

import torch
import torch.nn as nn

from ..core.errors import UserError
from ..core.registry import UnknownNameError, suggest
from .base import ATTACKS, Attack, SurrogateCall, register_attack

LIBRARIES = ("torchattack", "torchattacks")
#: the adapter's own code version (bump when what it gives the library or how it counts changes)
ADAPTER_VERSION = 1
#: harness parameters every attack takes; a library parameter of the same name that the adapter
#: does not map itself is exposed as ``lib_<name>``
_COMMON = ("eps", "norm", "steps", "alpha", "targeted", "seed", "ensemble", "loss", "target")
_EPS_NAMES = ("eps", "max_epsilon")
_STEP_NAMES = ("steps", "num_iter_set", "nb_iter")
#: constructor parameters the adapter fills itself (never a grid parameter)
_SET_HERE = {"self", "model", "normalize", "device", "clip_min", "clip_max", "targeted", "num_classes",
             "n_classes", "seed", "norm", "verbose"}
#: layer-name parameters: the attack hooks this layer of the surrogate (a single network)
_LAYER_PARAMS = ("feature_layer_cfg",)
#: attacks that cannot run here, and why (checked before anything runs)
REFUSED: dict[tuple[str, str], str] = {
    ("torchattack", "SSP"): "builds an ImageNet VGG-16 whose weights it downloads (the harness never downloads at run time)",
    ("torchattack", "GeoDA"): "a decision-based query attack at 224×224 that writes a 2 GB DCT basis into its package folder",
    ("torchattack", "L2T"): "hard-codes CUDA tensors and 224×224 images",
    ("torchattack", "SGM"): "hooks torchvision ResNet/DenseNet module names (relu, layerK.J) that the harness's networks "
                            "do not have (the harness's own sgm runs on them)",
    ("torchattack", "BPA"): "replaces torchvision ResNet modules (maxpool, layer3/layer4 ReLUs) that the harness's "
                            "networks do not have, so it would run as plain MI-FGSM",
}
#: attacks whose code in a given library version does not do what the attack does (refused for it)
_BROKEN: dict[tuple[str, str, str], str] = {
    ("torchattack", "MIG", "1.7.2"): "its loss is the true class's probability, ascended untargeted (the update has the "
                                     "wrong sign): it makes images more often right, not wrong",
}
#: attacks that draw tensors at 224×224 (ImageNet): refused on images of another size
_IMAGE_224 = {("torchattack", "SSA"): "draws its spectrum noise at 224×224 (ImageNet images)"}
#: attacks that need another package
_NEEDS = {("torchattack", "MuMoDIG"): "kornia"}


# --- the libraries ---------------------------------------------------------------------------------
def _import(library: str):
    if importlib.util.find_spec(library) is None:
        raise UserError(f"the {library}:<Name> attacks need the {library} package: pip install {library}")
    return importlib.import_module(library)


def library_version(library: str) -> str:
    return str(getattr(_import(library), "__version__", "unknown"))


def library_classes(library: str) -> dict[str, type]:
    """Every attack class the library offers, by name (adapted or not)."""
    mod = _import(library)
    if library == "torchattack":
        return dict(mod.ATTACK_REGISTRY)
    from torchattacks.attack import Attack as Base

    return {n: getattr(mod, n) for n in mod.__all__
            if inspect.isclass(getattr(mod, n, None)) and issubclass(getattr(mod, n), Base)
            and getattr(mod, n).__module__.startswith("torchattacks.attacks.")}


def _signature(cls: type) -> dict[str, inspect.Parameter]:
    return {k: p for k, p in inspect.signature(cls.__init__).parameters.items()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def refusal(library: str, name: str, cls: type) -> str | None:
    """Why ``library``'s attack ``name`` cannot run in the harness (None: it can)."""
    if (library, name) in REFUSED:
        return REFUSED[(library, name)]
    broken = _BROKEN.get((library, name, library_version(library)))
    if broken:
        return f"{library} {library_version(library)}'s {name} is broken: {broken}"
    need = _NEEDS.get((library, name))
    if need and importlib.util.find_spec(need) is None:
        return f"needs the {need} package (pip install {need})"
    category = getattr(getattr(cls, "attack_category", None), "value", "")
    if category == "GENERATIVE":
        return ("a generative attack whose pretrained ImageNet generator is downloaded at run time (the harness's own "
                "generative attacks train on the grid's data: cda, bia, ...)")
    if category == "GRADIENT_VIT":
        return "hooks the layers of timm ImageNet ViTs by name (hook_cfg), not the harness's networks"
    sig = _signature(cls)
    if category == "NON_EPS" or not any(k in sig for k in _EPS_NAMES):
        return "not bounded by ε (its output would have to be clipped into the ball: another attack)"
    if "model" not in sig:
        return "takes no model to attack"
    return None


def adapted_names(library: str) -> list[tuple[str, str | None]]:
    """(class name, why it is refused or None) for every attack class of ``library``."""
    return [(n, refusal(library, n, c)) for n, c in sorted(library_classes(library).items(), key=lambda kv: kv[0].lower())]


def note(library: str, name: str) -> str:
    """What a listing says besides the parameters (a condition the attack runs under)."""
    why = _IMAGE_224.get((library, name))
    return f"224×224 images only: it {why}" if why else ""


def _json_default(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str)) or (
        isinstance(v, (list, tuple)) and all(isinstance(e, (bool, int, float, str)) for e in v))


# --- the model the library attacks -------------------------------------------------------------
class _Passes:
    """Backward passes through one forward call: its rows, and how often a gradient left its
    logits or reached its input (the pass counts once per backward, whichever hook fired more)."""

    __slots__ = ("rows", "at_out", "at_in")

    def __init__(self, rows: int) -> None:
        self.rows, self.at_out, self.at_in = rows, 0, 0

    @property
    def passes(self) -> int:
        return self.rows * max(self.at_out, self.at_in)


class LibraryModel(nn.Module):
    """The surrogate set as one module for a library: pixels in [0,1] (N×C×H×W) → the weighted
    logit ensemble; counts backward passes per row. With one member, attribute lookups the module
    does not answer go to that member, so a library's layer names are the surrogate's own
    (``net.layers.4``)."""

    def __init__(self, models: list[nn.Module], weights: torch.Tensor) -> None:
        super().__init__()
        self.members = nn.ModuleList(models)
        self.register_buffer("w", weights.detach().clone().float(), persistent=False)
        self.calls: list[_Passes] = []

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            members = self._modules.get("members")
            if members is not None and len(members) == 1:
                return getattr(members[0], name)
            raise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        counting = torch.is_grad_enabled()
        if counting:
            rec = _Passes(int(x.shape[0]))
            self.calls.append(rec)
            if x.requires_grad:
                x = x.view_as(x)  # a node of this call, so the hook counts this call's passes

                def at_in(g: torch.Tensor) -> torch.Tensor:
                    rec.at_in += 1
                    return g.contiguous()  # channels-last members give strided gradients some libraries .view

                x.register_hook(at_in)
        out = sum(w * m(x) for w, m in zip(self.w, self.members))
        if counting and out.requires_grad:
            def at_out(g: torch.Tensor) -> None:
                rec.at_out += 1

            out.register_hook(at_out)
        return out

    def passes(self) -> int:
        """Backward passes so far, summed over rows (one image carried through one backward: 1)."""
        return sum(c.passes for c in self.calls)


@contextlib.contextmanager
def _global_seed(seed: int, device: torch.device):
    """torch's (CPU and the device's), numpy's and Python's global generators seeded with ``seed``
    inside the block and restored after it."""
    import numpy as np

    devices = [device] if device.type == "cuda" else []
    np_state, py_state = np.random.get_state(), random.getstate()
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        np.random.seed(seed % (2 ** 32))
        random.seed(seed)
        try:
            yield
        finally:
            np.random.set_state(np_state)
            random.setstate(py_state)


# --- the adapter --------------------------------------------------------------------------------
class LibraryAttack(Attack):
    """Base of the adapted classes (one subclass per library class; see the module docstring)."""

    library = ""
    class_name = ""
    lib_cls: type = object
    hooks_model = True  # libraries hook layers: never a compiled model
    #: the library's parameter names for what the harness sets: eps, steps, alpha (None: absent)
    _names: dict[str, str | None] = {}
    #: the grid's names of the library's own parameters (``lib_loss``) → the library's
    _renamed: dict[str, str] = {}
    _probe_memo: dict[str, int] = {}

    def __init__(self, **kwargs: Any) -> None:
        recorded = kwargs.pop("library", None)
        if recorded is not None and recorded != self.library_id():
            raise UserError(f"attack {self.name!r}: parameters recorded with {recorded}, but {self.library_id()} is "
                            f"installed; install that version to reproduce them")
        if kwargs.get("alpha") is not None and self._names.get("alpha") is None:
            raise UserError(f"attack {self.name!r}: {self.library}'s {self.class_name} has no step size (alpha); "
                            f"leave it out")
        super().__init__(**kwargs)
        if self._names.get("steps") is None and self.steps != 1:
            raise UserError(f"attack {self.name!r}: {self.library}'s {self.class_name} takes no number of steps; "
                            f"it runs once (steps: 1)")
        if self.targeted and not self._targetable():
            raise UserError(f"attack {self.name!r}: {self.library}'s {self.class_name} has no targeted mode")
        if self.loss != "ce":
            raise UserError(f"attack {self.name!r}: a library attack computes its own loss; leave loss at ce")
        if self.ensemble != "logit":
            raise UserError(f"attack {self.name!r}: a library attack attacks the logit ensemble; leave ensemble at logit")
        if self.extra.get("rng") not in ("batch", "image"):
            raise UserError(f"attack {self.name!r}: rng must be batch (global generators seeded per crafting batch) "
                            f"or image (each image alone, seeded by its index), got {self.extra.get('rng')!r}")
        for key in _LAYER_PARAMS:
            if key in self.extra and not self.extra[key]:
                raise UserError(f"attack {self.name!r}: needs {key}: a layer of the surrogate, like net.layers.4 "
                                f"(`advtransfer layers MODEL` lists them)")

    @classmethod
    def library_id(cls) -> str:
        return f"{cls.library} {library_version(cls.library)}"

    @classmethod
    def _targetable(cls) -> bool:
        if cls.library == "torchattack":
            return "targeted" in _signature(cls.lib_cls)
        return True  # torchattacks: set_mode_targeted_by_label (checked on the instance)

    def default_alpha(self) -> float:
        name = self._names.get("alpha")
        if name is not None:
            d = _signature(self.lib_cls)[name].default
            if isinstance(d, (int, float)) and not isinstance(d, bool):
                return float(d)
        return self.eps / self.steps

    def params(self) -> dict[str, Any]:
        return {**super().params(), "library": self.library_id()}

    @property
    def batch_dependent(self) -> bool:
        return self.extra["rng"] == "batch"

    # --- building the library's attack ----------------------------------------------------------
    def _kwargs(self, model: nn.Module, device: torch.device, num_classes: int, seed: int) -> dict[str, Any]:
        from ..core.utils import parse_fraction

        sig = _signature(self.lib_cls)
        kw: dict[str, Any] = {}
        for key, value in self.extra.items():
            if key == "rng":
                continue
            lib_key = self._renamed.get(key, key)
            d = sig[lib_key].default
            if isinstance(d, float) and isinstance(value, str):
                value = parse_fraction(value, key)
            kw[lib_key] = list(value) if isinstance(value, tuple) else value
        n = self._names
        kw[n["eps"]] = self.eps
        if n.get("steps"):
            kw[n["steps"]] = self.steps
        if n.get("alpha"):
            kw[n["alpha"]] = self.alpha
        if "device" in sig:
            kw["device"] = device
        if "normalize" in sig:
            kw["normalize"] = None
        for k in ("num_classes", "n_classes"):
            if k in sig:
                kw[k] = num_classes
        if "seed" in sig:
            kw["seed"] = seed
        if "norm" in sig:
            kw["norm"] = "Linf" if self.norm == "linf" else "L2"
        if "targeted" in sig:
            kw["targeted"] = self.targeted
        if "verbose" in sig:
            kw["verbose"] = False
        return kw

    def _attack_batch(self, model: LibraryModel, x: torch.Tensor, y: torch.Tensor, seed: int,
                      num_classes: int) -> torch.Tensor:
        with _global_seed(seed, x.device), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the libraries' own deprecation notes (meshgrid, ...)
            atk = self.lib_cls(model, **self._kwargs(model, x.device, num_classes, seed))
            if self.library == "torchattacks":
                if self.targeted:
                    if "targeted" not in getattr(atk, "supported_mode", ()):
                        raise UserError(f"attack {self.name!r}: torchattacks' {self.class_name} has no targeted mode")
                    atk.set_mode_targeted_by_label(quiet=True)
            out = atk(x, y)
        if isinstance(out, (tuple, list)):
            out = out[0]
        return out.detach().to(x.dtype).clamp(0, 1)

    def _batch_seed(self, index: torch.Tensor, stream: str) -> int:
        key = f"{self.seed}:{stream}:{','.join(map(str, index.tolist()))}"
        return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") & ((1 << 63) - 1)

    def _check_set(self, S: SurrogateCall, x: torch.Tensor) -> None:
        if any(S.surrogates.is_collection(i) for i in range(len(S))):
            raise UserError(f"attack {self.name!r}: a library attack takes plain surrogate models, not collections "
                            f"(LGV, SWAG, cSGLD)")
        if any(k in self.extra for k in _LAYER_PARAMS) and len(S) > 1:
            raise UserError(f"attack {self.name!r}: hooks one layer of one network; give it a single surrogate")
        why = _IMAGE_224.get((self.library, self.class_name))
        if why and tuple(x.shape[-2:]) != (224, 224):
            raise UserError(f"attack {self.name!r}: {why}; these images are {x.shape[-2]}×{x.shape[-1]}")

    def perturb(self, S: SurrogateCall, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        self._check_set(S, x)
        obj = S.objective
        if obj.ensemble != "logit" or obj.loss != "ce":
            raise UserError(f"attack {self.name!r}: a library attack takes the logit ensemble with its own loss")
        # a deep copy per batch: what a library hooks or replaces never reaches the surrogates
        models = [copy.deepcopy(m).eval() for m in S.models]
        # a layer attack may differentiate with respect to the layer's output on an input that needs
        # no gradient (NAA, BFA): the copies' weights then keep requires_grad so the layer has a graph
        layered = any(k in self.extra for k in _LAYER_PARAMS)
        for m in models:
            for p in m.parameters():
                p.requires_grad_(layered)
        with torch.no_grad():
            num_classes = int(models[0](x[:1]).shape[1])
        members = sum(S.evals_per_call(i) for i in range(len(S)))
        if self.extra["rng"] == "image":
            outs, worst = [], 0
            for k in range(len(x)):
                model = LibraryModel(models, S.weights)
                outs.append(self._attack_batch(model, x[k:k + 1], y[k:k + 1],
                                               self._batch_seed(index[k:k + 1], "image"), num_classes))
                worst = max(worst, model.passes())
            S.count(worst * members)
            return torch.cat(outs)
        model = LibraryModel(models, S.weights)
        out = self._attack_batch(model, x, y, self._batch_seed(index, "batch"), num_classes)
        S.count(math.ceil(model.passes() / len(x)) * members)
        return out

    # --- cost without running on the cell --------------------------------------------------------
    def grad_evals_formula(self, n_models: int) -> int:
        """Gradient evaluations per image on ``n_models`` plain models: measured once per parameter
        set on a tiny stand-in network (with the attack's hooked layer at its path)."""
        key = json.dumps([self.library, self.class_name, self.params(), self.targeted], sort_keys=True, default=str)
        if key not in self._probe_memo:
            try:
                LibraryAttack._probe_memo[key] = self._probe()
            except Exception:  # noqa: BLE001 - an estimate only: the cell counts what it really spends
                LibraryAttack._probe_memo[key] = self.steps
        return self._probe_memo[key] * n_models

    def _probe(self) -> int:
        side = 224 if (self.library, self.class_name) in _IMAGE_224 else 32
        layer = next((self.extra[k] for k in _LAYER_PARAMS if self.extra.get(k)), None)
        gen = torch.Generator().manual_seed(0)
        with _global_seed(0, torch.device("cpu")):
            net = _probe_network(layer)
            if any(k in self.extra for k in _LAYER_PARAMS):
                for p in net.parameters():
                    p.requires_grad_(True)
            x = torch.rand(2, 3, side, side, generator=gen)
            with torch.no_grad():
                y = net(x).argmax(1)  # classified right, so attacks that skip fooled images run
            model = LibraryModel([net], torch.ones(1))
            self._attack_batch(model, x, y, 0, 10)
        return math.ceil(model.passes() / 2)

    def check(self, cell: Any) -> None:
        """The preflight's check against the cell (:meth:`Attack.check`), and: a hooked layer
        resolves in the (single) surrogate, the images have the size the library needs."""
        sup = getattr(super(), "check", None)
        if sup is not None:
            sup(cell)
        nets = getattr(cell, "networks", ())
        layer = next(((k, self.extra[k]) for k in _LAYER_PARAMS if self.extra.get(k)), None)
        if layer is not None:
            if len(nets) > 1:
                raise UserError(f"attack {self.name!r}: hooks one layer of one network; give it a single surrogate")
            for model_name, net in nets:
                if net is not None and _rgetattr(net, layer[1]) is None:
                    from .features import list_layers

                    names = [li.name for li in list_layers(net)]
                    raise UserError(f"attack {self.name!r}: {layer[0]}: " + suggest(layer[1], names, f"layer of {model_name}"))
        shape = getattr(cell, "image_shape", None)
        why = _IMAGE_224.get((self.library, self.class_name))
        if why and shape is not None and tuple(shape[-2:]) != (224, 224):
            raise UserError(f"attack {self.name!r}: {why}; the grid's images are {shape[-2]}×{shape[-1]}")


def _rgetattr(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


class _Probe(nn.Module):
    """A tiny network (pixels → 10 logits) whose middle layer sits at ``layer`` (a dotted path)."""

    def __init__(self, layer: str | None) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, 2, 1)
        mid = nn.Sequential(nn.Conv2d(4, 4, 3, 1, 1), nn.ReLU())
        self.head = nn.Linear(4, 10)
        parts = layer.split(".") if layer else ["mid"]
        parent: nn.Module = self
        for p in parts[:-1]:
            if p not in parent._modules:
                parent.add_module(p, nn.Module())
            parent = parent._modules[p]
        parent.add_module(parts[-1], mid)
        self._mid = [mid]  # not a second registration

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self._mid[0](torch.relu(self.stem(x)))
        return self.head(z.mean((2, 3)))


def _probe_network(layer: str | None) -> nn.Module:
    torch.manual_seed(0)
    return _Probe(layer).eval()


def _make_adapter(library: str, name: str, cls: type) -> type[LibraryAttack]:
    sig = _signature(cls)
    names = {"eps": next(k for k in _EPS_NAMES if k in sig),
             "steps": next((k for k in _STEP_NAMES if k in sig), None),
             "alpha": "alpha" if "alpha" in sig else None}
    mapped = {v for v in names.values() if v}
    extra: dict[str, Any] = {}
    renamed: dict[str, str] = {}
    for k, p in sig.items():
        if k in _SET_HERE or k in mapped or p.default is inspect.Parameter.empty or not _json_default(p.default):
            continue
        grid_key = f"lib_{k}" if k in _COMMON or k == "rng" or k == "library" else k
        if grid_key != k:
            renamed[grid_key] = k
        extra[grid_key] = list(p.default) if isinstance(p.default, tuple) else p.default
    extra["rng"] = "batch"
    steps_default = sig[names["steps"]].default if names["steps"] else 1
    l2 = "l2" in name.lower()
    norms = ("linf", "l2") if "norm" in sig else (("l2",) if l2 else ("linf",))
    doc = (inspect.getdoc(cls) or "").splitlines()
    attrs = {
        "__doc__": f"{library} {name}: {doc[0] if doc else ''} (adapted; see advtransfer.attacks.ecosystem)",
        "__module__": __name__, "__qualname__": f"LibraryAttack[{library}:{name}]",
        "library": library, "class_name": name, "lib_cls": cls, "_names": names, "_renamed": renamed,
        "extra_defaults": extra, "norms": norms,
        "default_steps": int(steps_default) if isinstance(steps_default, int) and steps_default >= 1 else 10,
    }
    return type(f"{library}_{name}", (LibraryAttack,), attrs)


def _resolver(library: str) -> Callable[[str], None]:
    def resolve(name: str) -> None:
        classes = library_classes(library)
        full = f"{library}:{name}"
        if name not in classes:
            raise UnknownNameError(suggest(full, [f"{library}:{n}" for n in classes], f"{library} attack"))
        why = refusal(library, name, classes[name])
        if why:
            raise UserError(f"attack {full!r} cannot run here: {why}")
        register_attack(full, kind="gradient", version=ADAPTER_VERSION)(_make_adapter(library, name, classes[name]))

    return resolve


for _lib in LIBRARIES:
    ATTACKS.add_resolver(_lib, _resolver(_lib))
