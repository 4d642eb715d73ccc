"""The code's structure as the style guide states it: a name starting with ``_`` is used only in its own module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sotw", "simulator", "pipeline", "loadtest")


def private_imports() -> list[str]:
    """``file:line imports _name from module`` for every import of a private name from another module."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module:
                    for alias in node.names:
                        if alias.name.startswith("_") and not alias.name.startswith("__"):
                            where = path.relative_to(ROOT)
                            found.append(f"{where}:{node.lineno} imports {alias.name} from {node.module}")
    return found


def test_no_module_imports_a_private_name_from_another():
    assert private_imports() == []
