"""``advtransfer attacks``: the attack registry, library attacks and plugins' included."""
from __future__ import annotations

import argparse
import sys

from ..core.errors import UserError
from .common import plugin_flag


def add_parser(sub: argparse._SubParsersAction) -> None:
    plugin_flag(sub.add_parser("attacks", help="list the registered attacks (torchattack:<Name> and "
                                               "torchattacks:<Name> included) and their parameters"))


def run(args: argparse.Namespace) -> int:
    import inspect

    from ..attacks import ATTACKS
    from ..attacks.ecosystem import LIBRARIES, LibraryAttack, adapted_names, library_version, note
    from ..plugins import owner

    for name in ATTACKS.names():
        cls = ATTACKS.get(name)
        if issubclass(cls, LibraryAttack):
            continue  # listed with their library below
        doc = inspect.getdoc(cls) or ""
        extra = getattr(cls, "extra_defaults", {})
        params = ", ".join(f"{k}={v}" for k, v in extra.items())
        first = ((inspect.getdoc(sys.modules[cls.__module__]) or doc).splitlines() or [""])[0]
        plugin = owner("attack", name)
        print(f"{name:14s} [{cls.kind}, v{cls.version}] {first}" + (f" (plugin {plugin.ref})" if plugin else ""))
        if params:
            print(f"{'':14s} parameters: {params}")
    for lib in LIBRARIES:  # adapted on first use (advtransfer.attacks.ecosystem)
        try:
            names = adapted_names(lib)
        except UserError as exc:
            print(f"\n{lib}: not installed ({exc})")
            continue
        print(f"\n{lib} {library_version(lib)}: grid attacks {lib}:<Name>, the library's parameters passed through")
        for n, why in names:
            if why is None:
                cls = ATTACKS.get(f"{lib}:{n}")
                params = ", ".join(f"{k}={v}" for k, v in cls.extra_defaults.items())
                extra = f" ({note(lib, n)})" if note(lib, n) else ""
                print(f"  {lib + ':' + n:24s} [gradient, v{cls.version}] steps={cls.default_steps}, {params}{extra}")
        refused: dict[str, list[str]] = {}
        for n, why in names:
            if why is not None:
                refused.setdefault(why, []).append(n)
        for why, ns in refused.items():
            print(f"  not runnable here: {', '.join(ns)}: {why}")
    return 0
