"""Read a model's answer to a mutation prompt: SEARCH/REPLACE edits to the parent, or a whole template.

Edits look like

    <<<<<<< SEARCH
    lines copied from the parent template
    =======
    their replacement
    >>>>>>> REPLACE

and apply in order, each to the text the previous one left. A SEARCH that matches nowhere or in
more than one place is an error naming the edit: guessing would build something nobody asked for.
Matching is exact first, then line by line ignoring indentation and runs of blanks (models re-indent
freely); a whitespace-tolerant match re-indents the replacement by the same offset.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SEARCH = re.compile(r"^\s*<{5,9}\s*SEARCH\s*$")
_DIVIDER = re.compile(r"^\s*={5,9}\s*$")
_REPLACE = re.compile(r"^\s*>{5,9}\s*REPLACE\s*$")
_FENCE = re.compile(r"^[ \t]*```")
_HEADER_START = re.compile(r"\A\s*\{#-?\s*kfactory\b")


class EditError(ValueError):
    """An answer holds no usable template, or an edit cannot be applied."""


@dataclass(frozen=True)
class Edit:
    search: str
    replace: str


def _lines(text: str) -> list[str]:
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def parse_edits(answer: str) -> list[Edit]:
    """SEARCH/REPLACE blocks in order; [] when the answer has none."""
    edits: list[Edit] = []
    state, search, replace = "out", [], []
    for n, line in enumerate(_lines(answer), 1):
        if state == "out":
            if _SEARCH.match(line):
                state, search, replace = "search", [], []
            elif _REPLACE.match(line):
                raise EditError(f"answer line {n}: '>>>>>>> REPLACE' without a '<<<<<<< SEARCH' before it")
        elif state == "search":
            if _DIVIDER.match(line):
                state = "replace"
            elif _SEARCH.match(line) or _REPLACE.match(line):
                raise EditError(f"answer line {n}: edit {len(edits) + 1} has no '=======' between SEARCH and REPLACE")
            else:
                search.append(line)
        else:
            if _REPLACE.match(line):
                edits.append(Edit("\n".join(search), "\n".join(replace)))
                state = "out"
            elif _SEARCH.match(line):
                raise EditError(f"answer line {n}: edit {len(edits) + 1} has no '>>>>>>> REPLACE'")
            else:
                replace.append(line)
    if state != "out":
        raise EditError(f"edit {len(edits) + 1} is not terminated by '>>>>>>> REPLACE' (answer cut off?)")
    return edits


def _norm(line: str) -> str:
    return " ".join(line.split())


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _reindent(lines: list[str], have: str, want: str) -> list[str]:
    """Shift lines from the SEARCH's indentation to the matched text's."""
    if have == want:
        return lines
    if want.startswith(have):
        extra = want[len(have) :]
        return [extra + ln if ln.strip() else ln for ln in lines]
    if have.startswith(want):
        cut = have[len(want) :]
        return [ln[len(cut) :] if ln.startswith(cut) else ln for ln in lines]
    return lines


def _apply_one(text: str, edit: Edit, where: str) -> str:
    if not edit.search.strip():
        raise EditError(f"{where}: empty SEARCH text (edits change existing lines; send a whole template instead)")
    first = next(ln.strip() for ln in _lines(edit.search) if ln.strip())
    count = text.count(edit.search)
    if count == 1:
        return text.replace(edit.search, edit.replace, 1)
    if count > 1:
        raise EditError(f"{where}: SEARCH text is ambiguous, it matches {count} places (first line: {first!r})")
    lines = _lines(text)
    want = _lines(edit.search)
    while want and not want[0].strip():
        want.pop(0)
    while want and not want[-1].strip():
        want.pop()
    key = [_norm(ln) for ln in want]
    normed = [_norm(ln) for ln in lines]
    hits = [i for i in range(len(lines) - len(key) + 1) if normed[i : i + len(key)] == key]
    if not hits:
        raise EditError(f"{where}: SEARCH text not found in the parent template (first line: {first!r})")
    if len(hits) > 1:
        raise EditError(f"{where}: SEARCH text is ambiguous, it matches {len(hits)} places (first line: {first!r})")
    i = hits[0]
    repl = _lines(edit.replace) if edit.replace else []
    repl = _reindent(repl, _indent(want[0]), _indent(lines[i]))
    return "\n".join(lines[:i] + repl + lines[i + len(key) :])


def apply_edits(text: str, edits: list[Edit]) -> str:
    """The text after every edit, in order."""
    text = "\n".join(_lines(text))
    for k, e in enumerate(edits, 1):
        text = _apply_one(text, e, f"edit {k}/{len(edits)}")
    return text


def extract_template(answer: str) -> str | None:
    """The last fenced block that is a whole template (starts with the kfactory header), else None."""
    blocks: list[str] = []
    current: list[str] | None = None
    for line in _lines(answer):
        if _FENCE.match(line):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    if current is not None:
        raise EditError("the answer has an unterminated ``` block (answer cut off?)")
    whole = [b for b in blocks if _HEADER_START.match(b)]
    if whole:
        return whole[-1].strip("\n") + "\n"
    if not blocks and _HEADER_START.match(answer):
        return "\n".join(_lines(answer)).strip("\n") + "\n"
    if blocks:
        raise EditError(
            "the code block is not a whole template: it must start with the '{#- kfactory ... -#}' header "
            "(or send SEARCH/REPLACE edits)"
        )
    return None


def new_template_text(answer: str, parent_text: str) -> str:
    """The template an answer asks for: the parent with its edits applied, or the whole new template.

    Edits win when an answer has both: a fenced block around edits may quote header lines.
    """
    edits = parse_edits(answer)
    if edits:
        out = apply_edits(parent_text, edits)
        return out if out.endswith("\n") else out + "\n"
    text = extract_template(answer)
    if text is None:
        raise EditError("the answer holds neither a whole template in a ``` block nor SEARCH/REPLACE edits")
    return text
