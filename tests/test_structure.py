"""Package structure: no import cycle between modules, not even through imports inside functions
(the old uap <-> plots cycle was of that kind), and the attack layer does not depend on the model
store or on the analysis layer."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "advtransfer"


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """advtransfer modules imported anywhere in the file (module level and inside functions)."""
    mod = _module(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("advtransfer")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("advtransfer"):
                continue
            out.add(target)
            for a in node.names:  # `from . import x` imports the submodule x
                if (PKG.parent / (target + "." + a.name).replace(".", "/")).with_suffix(".py").is_file():
                    out.add(f"{target}.{a.name}")
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in PKG.rglob("*.py")}
    graph = {}
    for mod, path in files.items():
        deps = {d for d in _imports(path) if d in files and d != mod}
        # a package's __init__ importing its own submodules is not a cycle of concern
        graph[mod] = {d for d in deps if not (path.name == "__init__.py" and d.startswith(mod + "."))}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            # importing a submodule imports its package first
            for dep in [d]:
                if state.get(dep) == 1:
                    return stack[stack.index(dep):] + [dep]
                if dep not in state:
                    found = visit(dep)
                    if found:
                        return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_no_import_cycle():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_layers():
    graph = _graph()
    for mod, deps in graph.items():
        if mod.startswith("advtransfer.attacks"):
            bad = [d for d in deps if d.startswith(("advtransfer.models", "advtransfer.analysis", "advtransfer.runner"))]
            assert not bad, f"{mod} (attack layer) imports {bad}"
        if not mod.startswith("advtransfer.analysis") and mod not in ("advtransfer.cli",):
            bad = [d for d in deps if d.startswith("advtransfer.analysis")]
            assert not bad, f"{mod} imports the analysis layer {bad}: analysis reads run folders, nothing depends on it"


def test_detects_a_planted_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
