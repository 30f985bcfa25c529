"""What every command shares: the default store path and the errors that are the user's to fix."""

from __future__ import annotations

from pathlib import Path

DEFAULT_STORE = Path(".kfactory") / "store.duckdb"


class UsageError(ValueError):
    """A command was given something it cannot use (an output path that is a file, ...)."""


class UnknownNameError(KeyError):
    """An op, template or run the user named does not exist."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
