"""The one error `kfactory export` reports as the user's to fix (one line, exit code 2)."""

from __future__ import annotations


class ExportError(ValueError):
    """A run that cannot be exported (unknown, unfinished, empty), or an output folder that cannot be used."""
