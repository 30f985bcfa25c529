"""Keep credentials out of prompts, stored rows and logs: mask any environment secret in a text."""

from __future__ import annotations

import os
import re

_SECRET_NAME = re.compile(r"(API_?KEY|_KEY|TOKEN|SECRET|PASSWORD)$", re.IGNORECASE)
MASK = "***"


def secrets() -> list[str]:
    """Values of environment variables that look like credentials (long enough to mask safely)."""
    return [v for k, v in os.environ.items() if _SECRET_NAME.search(k) and len(v) >= 8]


def redact(text: str | None) -> str | None:
    """text with every environment secret masked."""
    if not text:
        return text
    for s in secrets():
        text = text.replace(s, MASK)
    return text
