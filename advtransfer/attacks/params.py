"""Declared attack parameters: one :class:`Param` per parameter an attack takes, with its default,
its type and its allowed values (range, choices, list length, or what it must name: a layer of
the surrogate, a class of the dataset, a zoo model, a count of training images).

An attack class lists its own parameters in ``parameters`` (merged over its bases'); the common
ones every attack takes (ε, norm, steps, ...) are
:func:`advtransfer.attacks.base.common_parameters`. From these one
description:

- :meth:`Param.check` judges a value as given (type and static range) when the attack is built,
  so no attack code sees a string where it expects a number;
- :meth:`Param.check_in` judges what needs the cell the attack will craft in (the surrogates'
  layers, the dataset's classes and training images): :meth:`Attack.check
  <advtransfer.attacks.base.Attack.check>` runs it in the preflight, before any model trains;
- :meth:`Param.describe` says in words what a parameter takes (``advtransfer attacks``, the
  reference pages), and the property tests draw invalid values from the declaration.

A new attack gets all three by declaring its parameters. Units: ε and step sizes in pixel space
(pixels in [0,1], like ``8/255``); class indices count from 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.errors import UserError
from ..core.utils import parse_fraction

if TYPE_CHECKING:
    import torch.nn as nn

#: the kinds of parameter (what :meth:`Param.check` accepts):
#: ``int`` an integer; ``number`` an int, a float or a fraction like ``1/255``, finite;
#: ``bool`` true/false; ``choice`` one of ``choices``; ``text`` any string; ``numbers`` a list of
#: numbers (``length`` of them if set), each within the range; ``layer`` a module name of the
#: surrogate or one of ``choices`` (``auto``, ``penultimate``); ``layers`` ``all`` or a non-empty
#: list of module names; ``class`` a class index of the dataset; ``target`` ``random``,
#: ``least_likely``, ``next`` or a class index; ``model`` a zoo entry's name (``''``: none); ``list`` any list
#: and ``any`` anything (only for parameters inferred from an undeclared default, see
#: :meth:`Param.inferred`)
KINDS = ("int", "number", "bool", "choice", "text", "numbers", "layer", "layers", "class", "target", "model",
         "list", "any")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> float | None:
    """``v`` as a finite float (ints, floats and fraction strings like ``1/255``), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return None
    try:
        f = parse_fraction(v)
    except (UserError, ValueError, TypeError, ZeroDivisionError):
        return None
    return f if math.isfinite(f) else None


def _fmt(v: float) -> str:
    return f"{v:g}"


@dataclass(frozen=True)
class Param:
    """One declared parameter: ``default`` (what the attack uses when the grid says nothing),
    ``kind`` (one of :data:`KINDS`), the closed or open range ``lo``..``hi`` for numbers, integers
    and lists of numbers, ``choices`` for a ``choice`` (or a ``layer``'s special names),
    ``length`` for ``numbers``, ``none_ok`` when ``None`` is accepted (the attack then picks,
    e.g. a momentum from the attack's own default), ``within`` (``train_images``: an ``int`` that
    may not exceed the training split, checked in the cell) and ``doc``, one line."""

    default: Any
    kind: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple[Any, ...] = ()
    length: int | None = None
    none_ok: bool = False
    within: str | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"parameter kind {self.kind!r} is not one of {KINDS}")
        if self.kind == "choice" and not self.choices:
            raise ValueError("a choice parameter needs choices")

    @classmethod
    def inferred(cls, default: Any) -> "Param":
        """A parameter known only by its default (a class that sets ``extra_defaults`` without
        declaring ``parameters``): the default's type, no range."""
        if isinstance(default, bool):
            return cls(default, "bool")
        if _is_int(default):
            return cls(default, "int")
        if isinstance(default, float) or (isinstance(default, str) and _number(default) is not None):
            return cls(default, "number")
        if isinstance(default, str):
            return cls(default, "text")
        if isinstance(default, (list, tuple)):
            return cls(default, "list")
        return cls(default, "any", none_ok=True)

    # --- what it takes, in words ---------------------------------------------------------------
    def range_text(self) -> str:
        """The range as interval notation (``[0, 1)``, ``>= 1``), or '' without one."""
        if self.lo is None and self.hi is None:
            return ""
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {_fmt(self.lo)}"
        if self.lo is None:
            return f"{'<' if self.hi_open else '<='} {_fmt(self.hi)}"
        return f"in {'(' if self.lo_open else '['}{_fmt(self.lo)}, {_fmt(self.hi)}{')' if self.hi_open else ']'}"

    def describe(self) -> str:
        """What the parameter takes, e.g. ``an integer >= 1``, ``one of logit, prob``."""
        r = self.range_text()
        k = self.kind
        if k == "int":
            text = "an integer" + (f" {r}" if r else "")
        elif k == "number":
            text = "a finite number (or a fraction like 1/255)" + (f" {r}" if r else "")
        elif k == "bool":
            text = "true or false"
        elif k == "choice":
            text = "one of " + ", ".join(str(c) if c != "" else "'' (the attack's default)" for c in self.choices)
        elif k == "text":
            text = "a string"
        elif k == "numbers":
            n = f"{self.length} " if self.length else ""
            text = f"a list of {n}numbers" + (f" {r}" if r else "")
        elif k == "layer":
            text = "a layer name of the surrogate (advtransfer layers MODEL lists them)" + (
                f" or {', '.join(self.choices)}" if self.choices else "")
        elif k == "layers":
            text = "all or a list of layer names of the surrogate"
        elif k == "class":
            text = "a class index of the dataset (0..classes-1)"
        elif k == "target":
            text = "random, least_likely, next or a class index of the dataset"
        elif k == "list":
            text = "a list"
        elif k == "any":
            text = "any value"
        else:  # model
            text = "the name of a zoo entry" + (" ('' for none)" if "" in (self.default, *self.choices) else "")
        if self.none_ok:
            text += " (or null: the attack's default)"
        if self.within == "train_images":
            text += ", at most the training split's size"
        return text

    # --- judging a value ----------------------------------------------------------------------------
    def _in_range(self, v: float) -> bool:
        if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
            return False
        if self.hi is not None and (v > self.hi or (self.hi_open and v == self.hi)):
            return False
        return True

    def check(self, attack: str, key: str, value: Any) -> Any:
        """``value`` as given if this parameter takes it (type and static range), else a
        :class:`UserError` naming the attack, the parameter and what it takes. Values are not
        converted here: the recorded parameters (and so the cell ids) keep the user's spelling."""
        def bad() -> UserError:
            return UserError(f"attack {attack!r}: parameter {key} must be {self.describe()}, got {value!r}")

        if value is None:
            if self.none_ok:
                return value
            raise bad()
        k = self.kind
        if k == "int" or k == "class":
            if not _is_int(value) or not self._in_range(value) or (k == "class" and value < 0):
                raise bad()
        elif k == "number":
            f = _number(value)
            if f is None or not self._in_range(f):
                raise bad()
        elif k == "bool":
            if not isinstance(value, bool):
                raise bad()
        elif k == "choice":
            if not isinstance(value, (str, int, float)) or isinstance(value, bool) or value not in self.choices:
                raise bad()
        elif k in ("text", "model"):
            if not isinstance(value, str):
                raise bad()
        elif k == "numbers":
            if not isinstance(value, (list, tuple)) or (self.length is not None and len(value) != self.length) \
                    or not value:
                raise bad()
            for v in value:
                f = _number(v)
                if f is None or isinstance(v, str) or not self._in_range(f):
                    raise bad()
        elif k == "layer":
            if not isinstance(value, str) or not value:
                raise bad()
        elif k == "layers":
            if not (value == "all" or (isinstance(value, (list, tuple)) and value
                                       and all(isinstance(s, str) and s for s in value))):
                raise bad()
        elif k == "list":
            if not isinstance(value, (list, tuple)):
                raise bad()
        elif k == "target":
            if not (value in ("random", "least_likely", "next") or (_is_int(value) and value >= 0)):
                raise bad()
        return value

    def check_in(self, attack: str, key: str, value: Any, cell: "CellView", uses_layer: bool = True) -> None:
        """What needs the cell: a ``layer``/``layers`` value resolves in each surrogate network the
        preflight could build (``uses_layer``: the attack reads it with its other values, so
        ``auto``/``penultimate`` must resolve too; a named layer must exist either way); a
        ``class``/``target`` index lies within the dataset's classes; a count ``within``
        ``train_images`` fits the training split. A :class:`UserError` otherwise."""
        k = self.kind
        if k in ("class", "target") and _is_int(value) and not 0 <= value < cell.num_classes:
            raise UserError(f"attack {attack!r}: {key} {value} is outside the label set 0..{cell.num_classes - 1}")
        if self.within == "train_images" and cell.n_train is not None and _is_int(value) and value > cell.n_train:
            raise UserError(f"attack {attack!r}: {key} {value} exceeds the {cell.n_train} training images")
        if k in ("layer", "layers") and value is not None:
            names = [value] if k == "layer" else ([] if value == "all" else list(value))
            for name in names:
                if name in self.choices and not uses_layer:
                    continue
                for model_name, net in cell.networks:
                    if net is None:
                        continue
                    from .features import resolve_layer

                    try:
                        resolve_layer(net, name, cell.image_shape, model_name)
                    except UserError as e:
                        raise UserError(f"attack {attack!r}: {key}: {e}") from None


@dataclass(frozen=True)
class CellView:
    """What the preflight knows of the cell an attack will craft in, before any model trains:
    ``networks``: (model name, a freshly initialised network of its architecture, or None where
    none can be built without its weights) per surrogate member; ``num_classes``; ``image_shape``
    C×H×W; ``n_train``: images in the training split (None when not loaded); ``size``: the zoo size; ``archs``: (model name, architecture name) per member."""

    networks: tuple[tuple[str, "nn.Module | None"], ...] = ()
    num_classes: int = 10
    image_shape: tuple[int, int, int] = (3, 32, 32)
    n_train: int | None = None
    size: str = "ci"
    archs: tuple[tuple[str, str], ...] = ()
