"""Reading a TOML file a user wrote (a scenario, a drill, an engines file): one way of saying it cannot be read or parsed."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_toml(path: Path, what: str, error: Callable[[str], Exception]) -> dict[str, Any]:
    """The file's tables; ``error(message)`` raised naming ``what`` it is and the file if it cannot be read or parsed."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{what} {path} is not valid TOML: {exc}") from None
