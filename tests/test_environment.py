"""Every environment variable the package reads is read in core/config.py, listed in
``config.ENVIRONMENT`` and in the CLI's help; a bad value is one line."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from advtransfer.core.errors import UserError

PKG = Path(__file__).resolve().parent.parent / "advtransfer"


def _environ_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, variable) of every os.environ / os.getenv read of a constant name."""
    out = []
    for n in ast.walk(tree):
        arg = None
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.args:
            f = n.func
            if (f.attr in ("get", "pop") and isinstance(f.value, ast.Attribute) and f.value.attr == "environ") \
                    or f.attr == "getenv":
                arg = n.args[0]
        elif isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute) and n.value.attr == "environ":
            arg = n.slice
        elif isinstance(n, ast.Compare) and any(isinstance(c, ast.Attribute) and c.attr == "environ" for c in n.comparators):
            arg = n.left
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            out.append((n.lineno, arg.value))
    return out


def test_environment_variables_are_read_in_config_and_listed_in_the_help():
    from advtransfer.cli import EPILOG
    from advtransfer.core.config import ENVIRONMENT

    named = set()
    for path in PKG.rglob("*.py"):
        text = path.read_text()
        named |= set(re.findall(r"ADVTRANSFER_[A-Z_]+", text))
        if path.name != "config.py" or path.parent != PKG / "core":
            reads = [r for r in _environ_reads(ast.parse(text)) if r[1].startswith("ADVTRANSFER_")]
            assert not reads, f"{path.relative_to(PKG)}:{reads[0][0]} reads {reads[0][1]} outside core/config.py"
    assert named <= set(ENVIRONMENT), f"not listed in config.ENVIRONMENT: {sorted(named - set(ENVIRONMENT))}"
    assert all(name in EPILOG for name in ENVIRONMENT)
    assert _environ_reads(ast.parse("import os\nos.environ.get('ADVTRANSFER_X')\n'ADVTRANSFER_Y' in os.environ\n")) \
        == [(2, "ADVTRANSFER_X"), (3, "ADVTRANSFER_Y")]  # the scan sees both kinds of read


def test_a_bad_image_size_is_one_line(monkeypatch):
    from advtransfer.core.config import imagenet_image_size

    monkeypatch.setenv("ADVTRANSFER_IMAGE_SIZE", "big")
    with pytest.raises(UserError, match="ADVTRANSFER_IMAGE_SIZE='big'"):
        imagenet_image_size()
    monkeypatch.setenv("ADVTRANSFER_IMAGE_SIZE", "224")
    assert imagenet_image_size() == 224
