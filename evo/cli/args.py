"""Argument types the commands share."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """A whole number >= 1, or argparse's error naming the value."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n
