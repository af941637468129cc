"""A small name -> object registry with helpful errors for unknown names."""
from __future__ import annotations

import difflib
import fnmatch
from typing import Any, Callable, Generic, Iterator, TypeVar

from .errors import UserError

T = TypeVar("T")


class UnknownNameError(UserError, KeyError):
    """Raised for a name that is not registered; the message suggests close matches."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def suggest(name: str, choices: list[str], kind: str) -> str:
    """One-line message for an unknown `name` among `choices`, with close matches."""
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    shown = ", ".join(sorted(choices)[:30])
    more = " ..." if len(choices) > 30 else ""
    return f"unknown {kind} {name!r}{hint} (known: {shown}{more})"


class Registry(Generic[T]):
    """Maps names to objects (classes or factories), with tags per entry."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._tags: dict[str, dict[str, Any]] = {}
        self._aliases: dict[str, str] = {}
        self._resolvers: dict[str, Callable[[str], None]] = {}

    def add_resolver(self, prefix: str, resolve: Callable[[str], None]) -> None:
        """Names ``<prefix>:<rest>`` are registered on first use by ``resolve(rest)`` (which calls
        :meth:`add`, or raises a UserError saying why the name cannot be used): the adapted
        attacks of other libraries (``torchattack:MIFGSM``) without importing them up front.
        :meth:`names` lists only what is registered so far."""
        if prefix in self._resolvers:
            raise ValueError(f"{self.kind} prefix {prefix!r} registered twice")
        self._resolvers[prefix] = resolve

    def _resolve(self, name: str) -> None:
        prefix, sep, rest = name.partition(":")
        if sep and prefix in self._resolvers and name not in self._items and name not in self._aliases:
            self._resolvers[prefix](rest)

    def register(self, name: str, **tags: Any) -> Callable[[T], T]:
        """Decorator: register the decorated object under `name` with optional tags."""

        def deco(obj: T) -> T:
            self.add(name, obj, **tags)
            return obj

        return deco

    def add(self, name: str, obj: T, aliases: str | tuple[str, ...] | list[str] = (), **tags: Any) -> None:
        """Register ``obj`` under ``name``; ``aliases`` are other names :meth:`get` resolves to it."""
        aliases = (aliases,) if isinstance(aliases, str) else tuple(aliases)
        for n in (name, *aliases):
            if n in self._items or n in self._aliases:
                raise ValueError(f"{self.kind} {n!r} registered twice")
        self._items[name] = obj
        self._tags[name] = dict(tags, aliases=aliases)
        for a in aliases:
            self._aliases[a] = name

    def retag(self, name: str, **tags: Any) -> None:
        """Add or replace tags of a registered entry (a plug-in's source checksum, say)."""
        self._tags[self.canonical(name)].update(tags)

    def code(self, name: str) -> str | None:
        """The sha256 of the plug-in source that registered ``name`` (tag ``plugin_sha256``, set by
        :mod:`advtransfer.plugins`); None for the harness's own entries and unknown names."""
        name = self._aliases.get(name, name)
        return self._tags[name].get("plugin_sha256") if name in self._tags else None

    def remove(self, name: str) -> T:
        """Unregister ``name`` and its aliases (for plug-ins and tests); returns the object."""
        name = self.canonical(name)
        for a in self._tags[name].get("aliases", ()):
            self._aliases.pop(a, None)
        self._tags.pop(name)
        return self._items.pop(name)

    def canonical(self, name: str) -> str:
        """The registered name of ``name`` (an alias resolves to its entry); unknown names raise."""
        name = self._aliases.get(name, name)
        if name not in self._items and isinstance(name, str):
            self._resolve(name)
        if name not in self._items:
            raise UnknownNameError(suggest(name, list(self._items) + list(self._aliases), self.kind))
        return name

    def get(self, name: str) -> T:
        return self._items[self.canonical(name)]

    def tags(self, name: str) -> dict[str, Any]:
        return dict(self._tags[self.canonical(name)])

    def names(self, pattern: str = "*", **tags: Any) -> list[str]:
        """Registered names (aliases excluded) matching ``pattern`` and every given tag value."""
        return sorted(n for n in self._items if fnmatch.fnmatch(n, pattern)
                      and all(self._tags[n].get(k) == v for k, v in tags.items()))

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)
