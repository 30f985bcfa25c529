"""Translate dispatch tables across dtypes by bytes per row: a row-wise kernel that is fastest on 16-bit rows of
N elements is a candidate for fp32 rows of N / 2 elements (the same bytes a row, the same loads a thread) with
its vector width in elements scaled to keep the bytes a load (16-bit vec 8 -> fp32 vec 4), and the reverse.
The result is a table of predictions, not of measurements: its entries carry no median, only the cell and
time they came from, and the table says `"kind": "predictions"`, so that `[search] seed_tables` starts a run
from each of them beside the cell's fastest measured entry (the run times them; evo/loop/seed_tables.py)."""

from __future__ import annotations

import re

from evo.tools.errors import ToolInputError

SIZES = {"bf16": 2, "fp16": 2, "fp32": 4}
ELEMENT_PARAMS = ("vec",)  # parameters counted in elements (scaled with the element size)
_LABEL = re.compile(r"(?P<dtypes>[^ ]+) M(?P<M>\d+)-N(?P<N>\d+)")


def _parse(label: str) -> tuple[dict[str, str], int, int] | None:
    m = _LABEL.fullmatch(label)
    if not m:
        return None
    pairs = [p.split("=", 1) for p in m["dtypes"].split(",")]
    if any(len(p) != 2 for p in pairs):
        return None
    return dict(pairs), int(m["M"]), int(m["N"])


def _fastest(tables: list[dict]) -> dict[str, dict]:
    """Per cell label, the entry with the lowest median_us over the tables (entries without one are left out)."""
    best: dict[str, dict] = {}
    for t in tables:
        if not isinstance(t.get("dispatch"), dict):
            raise ToolInputError("a table has no 'dispatch' object")
        for label, e in t["dispatch"].items():
            m = e.get("median_us")
            if isinstance(m, (int, float)) and (label not in best or m < best[label]["median_us"]):
                best[label] = e
    return best


def _scaled(params: dict, src: int, dst: int) -> dict | None:
    """`params` with the element-counted parameters scaled from `src` to `dst` bytes an element; None when one
    does not scale to a whole number >= 1."""
    out = dict(params)
    for p in ELEMENT_PARAMS:
        if p in out:
            scaled = out[p] * src
            if scaled % dst or scaled // dst < 1:
                return None
            out[p] = scaled // dst
    return out


def translate(tables: list[dict]) -> dict:
    """Per cell of the tables, its fastest entry (lowest median_us) carried to every other dtype whose cell has
    the same bytes a row, where the sizes divide evenly; a cell a table measured itself is still given the
    translations (they are predictions beside its measurement). Cells with mixed dtypes are not translated."""
    out: dict[str, dict] = {}
    for label, e in sorted(_fastest(tables).items()):
        parsed = _parse(label)
        if parsed is None:
            continue
        dtypes, m, n = parsed
        kinds = set(dtypes.values())
        if len(kinds) != 1 or not kinds <= set(SIZES):
            continue
        (src,) = kinds
        for dst, size in SIZES.items():
            if size == SIZES[src] or (n * SIZES[src]) % size:
                continue
            params = _scaled(e["params"], SIZES[src], size)
            if params is None:
                continue
            new = ",".join(f"{k}={dst}" for k in dtypes) + f" M{m}-N{n * SIZES[src] // size}"
            cand = {"template": e["template"], "params": params, "translated_from": label,
                    "source_median_us": e["median_us"]}
            # several sources of one cell (bf16 and fp16 into fp32): keep the fastest source
            if new not in out or e["median_us"] < out[new]["source_median_us"]:
                out[new] = cand
    return {"run_id": None, "kind": "predictions", "translated_from": [t.get("run_id") for t in tables],
            "note": "predictions by bytes per row (kfactory dispatch translate), not measurements",
            "dispatch": dict(sorted(out.items()))}
