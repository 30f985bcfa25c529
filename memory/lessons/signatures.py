"""Failure signatures: error messages stripped of specifics, so that like failures group together."""

from __future__ import annotations

import re

# evo.measure.verify.pattern's names for how an output is wrong, most specific first.
_WRONG_PATTERNS = (
    "wrote outside output",
    "all unwritten or NaN",
    "last row unwritten or NaN",
    "tail elements unwritten or NaN",
    "some unwritten or NaN",
    "all wrong",
    "last row wrong",
    "tail elements wrong",
    "some elements wrong",
    "error norm too large",
)
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
_PATH = re.compile(
    r"(?:[A-Za-z]:)?(?:~|\.{1,2})?/?(?:[\w.+-]+/)+[\w.+-]*|\b[\w.+-]+\.(?:cu|cuh|h|hpp|cpp|cc|c|py|ptx|cubin|j2|o)\b"
)
_HEX = re.compile(r"\b0[xX][0-9a-fA-F]+\b|\b(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}\b")
_IDENT = re.compile(r"\b(?=\w*[_\d])[A-Za-z_]\w*\b")  # names with an underscore or digit: kernels, symbols
_NUMBER = re.compile(r"[-+]?\b\d+(?:\.\d+)?(?:[eE][-+]?\d+)?\b")
MAX_SIGNATURE_CHARS = 160


def normalize_error(text: str | None) -> str:
    """The first error line with quoted names, paths, hex, identifiers and numbers replaced by placeholders."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    if not lines:
        return ""
    line = next((ln for ln in lines if "error" in ln.lower()), lines[0])
    line = _QUOTED.sub("<id>", line)
    line = _PATH.sub("<path>", line)
    line = _HEX.sub("<hex>", line)
    line = _IDENT.sub("<id>", line)
    line = _NUMBER.sub("<n>", line)
    return " ".join(line.split())[:MAX_SIGNATURE_CHARS]


def signature(status: str, error: str | None) -> str:
    """What a failure looks like, stripped of specifics: a wrong-answer pattern, else the normalized message."""
    text = error or ""
    if status == "WRONG_ANSWER":
        for p in _WRONG_PATTERNS:
            if p in text:
                return p
        if "nan" in text.lower():
            return "NaN"
    return normalize_error(text) or "(no message)"
