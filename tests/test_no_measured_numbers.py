"""Numbers live where they are measured: the package's docstrings and comments say what the code
does and in what units; measured figures (times, rates, accuracies, speed-ups) belong in model
cards, run records, results/notes/ and the generated pages, where they are remeasured. A number
the package quotes from a paper or a published model collection is a citation, not a measurement
of ours, and may stay when the sentence names its source."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "advtransfer"

#: what a measured figure looks like (a number not glued to a name: ``ResNet-20s`` is no duration)
PATTERNS = {
    "a duration": r"(?<![-\w.])\d+(?:\.\d+)?\s?(?:ms|s|sec|seconds|min|minutes|h|hours)\b",
    "a percentage with decimals": r"(?<![-\w.])\d+\.\d+\s?%",
    "a rate": r"(?<![-\w.])\d+(?:\.\d+)?\s?(?:it/s|img/s|images/s|steps/s|samples/s)\b",
    "a speed-up": r"(?<![-\w.])\d+(?:\.\d+)?\s?(?:×|x|times)\s(?:faster|slower|as fast|the cost)",
    "a measurement": r"\bmeasured\b[^.;]{0,40}?(?<![-\w.])\d",
}
#: words that name the source of a quoted number within the 100 characters before it
CITED = re.compile(r"paper|reports?\b|published|et al|pytorch-cifar-models|official|authors", re.I)


def _texts(path: Path):
    """(line, text) of every docstring and comment of a module."""
    src = path.read_text()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def measured_numbers(text: str) -> list[tuple[str, str]]:
    """(kind, excerpt) of each measured-looking number in ``text`` that cites no source."""
    found = []
    for what, pat in PATTERNS.items():
        for m in re.finditer(pat, text):
            if CITED.search(text[max(0, m.start() - 100):m.start()]):
                continue
            found.append((what, text[max(0, m.start() - 60):m.end() + 20].replace("\n", " ")))
    return found


@pytest.mark.parametrize("text,kinds", [
    ("training takes about 37 minutes on 2 cores", ["a duration"]),
    ("the converged ResNet-20 reaches 90.7% on test images", ["a percentage with decimals"]),
    ("vectorised members run 1.8× faster than the loop", ["a speed-up"]),
    ("chunks of 128 images, 400 img/s on one core", ["a rate"]),
    ("rewards measured 0.07-0.13 nats", ["a measurement"]),
    ("(measured: 7 up, 4 down over 36 rows)", ["a measurement"]),
    ("the paper's CCT-4/3x2 reaches 91.97% after 300 epochs", []),   # a citation
    ("a collection of 40 ResNet-20s is 22 MB", []),                   # no measurement
    ("L∞ ε = 8/255, 10 steps of ε/10, step 0.5 (pixels in [0, 1])", []),
])
def test_the_detector(text, kinds):
    assert [k for k, _ in measured_numbers(text)] == kinds


def test_no_measured_number_in_a_package_docstring_or_comment():
    hits = [f"{p.relative_to(PKG.parent)}:{line}: {what}: ...{ex}..."
            for p in sorted(PKG.rglob("*.py")) for line, text in _texts(p) for what, ex in measured_numbers(text)]
    assert not hits, ("measured numbers in the package (move them to cards, records, results/notes/ or the "
                      "generated pages; cite the source of a quoted one):\n" + "\n".join(hits))
