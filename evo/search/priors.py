"""Parameter priors: sampling weights per template, parameter and value, from the store's param-effect lessons
for the run's cells; the tiling mutations draw values by them."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from evo.search.lessons import MIN_USEFULNESS, CellLike, applicable, cell_facts
from memory.queries import PARAM_EFFECT, bucket_label, dtype_key, shape_bucket
from memory.store import Store


def _effect_lessons(
    store: Store, op: str, arch: str, cells: Sequence[CellLike] | None, min_usefulness: float,
    edges: Mapping[str, tuple[int, int]] | None = None,
) -> list[tuple[str, float, dict[str, Any], dict[str, Any]]]:
    """(lesson_id, usefulness, scope, structured) of the param-effect lessons that apply to the cells."""
    found = [
        (r.lesson_id, float(r.usefulness), json.loads(r.scope_json), json.loads(r.structured_json))
        for r in applicable(store, op, arch, PARAM_EFFECT, min_usefulness).itertuples(index=False)
    ]
    # Only lessons with per-value effects (an LLM-written lesson of this kind may carry text alone).
    found = [f for f in found if {"template", "param", "dtype", "bucket"} <= set(f[2]) and "values" in f[3]]
    if not cells:
        return found
    wanted = set()
    for cell in cells:
        dtypes, dims = cell_facts(cell)
        wanted.add((dtype_key(dtypes), bucket_label(shape_bucket(dims, edges))))
    near = [f for f in found if (f[2]["dtype"], bucket_label(f[2]["bucket"])) in wanted]
    return near or found  # no lesson for these cells' buckets: what is known elsewhere beats nothing


def param_priors(
    store: Store,
    op: str,
    arch: str,
    cells: Sequence[CellLike] | None = None,
    *,
    space: Mapping[str, Mapping[str, Sequence[Any]]] | None = None,
    temperature: float = 0.1,
    floor: float = 0.05,
    min_usefulness: float = MIN_USEFULNESS,
    edges: Mapping[str, tuple[int, int]] | None = None,
) -> dict[str, dict[str, dict[Any, float]]]:
    """template -> param -> value -> sampling weight, from the param-effect lessons for these cells.

    share = floor + (1 - k*floor) * softmax(-effect / temperature) over a param's k values, where effect
    is the value's log(time / cell best) against the other values, pooled over the lessons (inverse
    variance weighted, scaled by usefulness). Every value keeps at least `floor` of the odds, so the
    search keeps exploring. Weights are k * share: they average 1, the neutral weight evo.search.operators.step
    gives a value the prior does not know. Values in `space` that no lesson has seen get effect 0; pass
    the run's space so every legal value is weighed together.
    """
    pooled: dict[tuple[str, str], dict[str, list[float]]] = {}
    values: dict[tuple[str, str], dict[str, Any]] = {}
    for _, usefulness, scope, s in _effect_lessons(store, op, arch, cells, min_usefulness, edges):
        key = (scope["template"], scope["param"])
        for v in s["values"]:
            vk = json.dumps(v["value"], sort_keys=True)
            w = max(0.1, 1.0 + usefulness) / max(v["effect_se"] ** 2, 1e-6)
            acc = pooled.setdefault(key, {}).setdefault(vk, [0.0, 0.0])
            acc[0] += w * v["effect_vs_rest"]
            acc[1] += w
            values.setdefault(key, {})[vk] = v["value"]
    for template, params in (space or {}).items():
        for param, vals in params.items():
            for v in vals:
                vk = json.dumps(v, sort_keys=True)
                pooled.setdefault((template, param), {}).setdefault(vk, [0.0, 0.0])
                values.setdefault((template, param), {})[vk] = v
    out: dict[str, dict[str, dict[Any, float]]] = {}
    for (template, param), accs in sorted(pooled.items()):
        effects = {vk: (a[0] / a[1] if a[1] > 0 else 0.0) for vk, a in accs.items()}
        out.setdefault(template, {})[param] = {
            values[(template, param)][vk]: w for vk, w in _floored_softmax(effects, temperature, floor).items()
        }
    return out


def _floored_softmax(effects: Mapping[str, float], temperature: float, floor: float) -> dict[str, float]:
    """Lower effect (faster) gets more weight; each value keeps at least floor of the odds; mean weight 1."""
    k = len(effects)
    if k * floor >= 1.0:
        return {v: 1.0 for v in effects}
    lo = min(effects.values())
    exps = {v: math.exp(-(e - lo) / temperature) for v, e in effects.items()}
    total = sum(exps.values())
    return {v: k * (floor + (1.0 - k * floor) * x / total) for v, x in exps.items()}


def prior_sources(
    store: Store, op: str, arch: str, cells: Sequence[CellLike] | None = None, min_usefulness: float = MIN_USEFULNESS,
    edges: Mapping[str, tuple[int, int]] | None = None,
) -> dict[str, dict[str, list[str]]]:
    """template -> param -> ids of the lessons param_priors pooled (to record which lessons biased a mutation)."""
    out: dict[str, dict[str, list[str]]] = {}
    for lesson_id, _, scope, _ in _effect_lessons(store, op, arch, cells, min_usefulness, edges):
        out.setdefault(scope["template"], {}).setdefault(scope["param"], []).append(lesson_id)
    return {t: {p: sorted(ids) for p, ids in ps.items()} for t, ps in out.items()}
