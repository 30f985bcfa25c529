"""The one error a tool raises for input it cannot use (a missing file, a table without entries, ...)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class ToolInputError(ValueError):
    """A tool was given a file or value it cannot use; the message names it."""


def read_json(path: Path) -> Any:
    """The JSON document at `path`; ToolInputError naming the file when it is missing or not JSON."""
    if not path.is_file():
        raise ToolInputError(f"no such file: {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ToolInputError(f"{path} is not JSON ({e})") from None


def require_file(path: Path, what: str) -> Path:
    """`path`, or ToolInputError naming it as `what` when there is no file there."""
    if not path.is_file():
        raise ToolInputError(f"no {what} at {path}")
    return path
