"""The code's layout: modules a reader can hold, and private names that stay in their own module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("pipeline", "sotw", "simulator", "loadtest")
#: The packages whose modules must stay short: the two a change most often lands in.
SHORT = ("pipeline", "loadtest")
MOST_LINES = 500
# Modules allowed to be longer, each with the reason its own docstring gives.
KEPT_WHOLE: dict[str, str] = {
    "loadtest/locust/conductor.py": "one object driven by events, whose handlers share its state",
}
# A named tuple's public methods start with "_" only to keep clear of its field names.
NAMEDTUPLE_API = {"_make", "_asdict", "_replace", "_fields", "_field_defaults"}


def modules(packages: tuple[str, ...] = PROJECT) -> list[Path]:
    return sorted(path for package in packages for path in (ROOT / package).rglob("*.py"))


def private_imports(path: Path) -> list[str]:
    """``module._name`` for every private name of another project module that ``path`` imports or reads."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    aliases: dict[str, str] = {}  # local name -> project module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PROJECT:
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] not in PROJECT:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{node.module}.{alias.name} (line {node.lineno})")
                else:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr not in NAMEDTUPLE_API
        ):
            found.append(f"{aliases[node.value.id]}.{node.attr} (line {node.lineno})")
    return found


def test_no_module_uses_a_private_name_of_another_module() -> None:
    crossing = {str(path.relative_to(ROOT)): names for path in modules() if (names := private_imports(path))}
    assert crossing == {}, "make the name public where it is shared, or keep its use in its own module"


def test_no_pipeline_or_loadtest_module_is_longer_than_a_reader_can_hold() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in modules(SHORT)
        if (n := len(path.read_text().splitlines())) > MOST_LINES
        and str(path.relative_to(ROOT)) not in KEPT_WHOLE
    }
    assert long == {}, (
        f"split modules over {MOST_LINES} lines by concern, or write at the top of one why it stays whole "
        "and name it in KEPT_WHOLE"
    )


def test_the_layout_check_sees_a_private_name_crossing_modules(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from pipeline.sinks import _hive_segment\nimport pipeline.query as q\nfrom pipeline.state import End\n"
        "q._VIOLATION\nx._ok\nEnd._make\n"
    )
    assert private_imports(module) == [
        "pipeline.sinks._hive_segment (line 1)",
        "pipeline.query._VIOLATION (line 4)",
    ]
