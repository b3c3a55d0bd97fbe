"""Layers run one way: decoding (the pure engine) <- models <- training, data <- bench, predict,
budget, demo, trainer <- cli. Checked on the source, so a hidden import inside a function counts."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "src" / "specdiff_lightning"
TOP = {"bench", "predict", "budget", "demo", "trainer", "cli"}
#: layer -> what it must never import
FORBIDDEN = {
    "decoding": {"models", "training", "data", "metrics", *TOP},
    "models": {"training", "data", "metrics", *TOP},
    "training": {"data", *TOP},
    "data": {"training", "metrics", *TOP},
}


def _imported_subpackages(path: Path) -> set[str]:
    """First component under ``specdiff_lightning`` of every import in ``path``."""
    module = path.relative_to(PACKAGE).with_suffix("").parts
    package = module[:-1]  # the package a relative import starts from (for __init__ too)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - (node.level - 1)]) if node.level > 1 else list(package)
                parts = base + (node.module.split(".") if node.module else [])
                names = [parts] if node.module else [base + [a.name] for a in node.names]
            elif (node.module or "").startswith("specdiff_lightning"):
                names = [node.module.split(".")[1:]]
            else:
                continue
            found |= {n[0] for n in names if n}
        elif isinstance(node, ast.Import):
            found |= {
                a.name.split(".")[1]
                for a in node.names
                if a.name.startswith("specdiff_lightning.") and a.name.count(".") >= 1
            }
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_import_downwards_only(layer):
    bad = {}
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        wrong = _imported_subpackages(path) & FORBIDDEN[layer]
        if wrong:
            bad[str(path.relative_to(PACKAGE))] = sorted(wrong)
    assert not bad, f"{layer}/ imports from layers above it: {bad}"


def test_the_checker_sees_relative_imports():
    assert "decoding" in _imported_subpackages(PACKAGE / "models" / "diffusion.py")
    assert "constants" in _imported_subpackages(PACKAGE / "data" / "windows.py")
