"""What the search asks the lesson store: evaluations as DataFrames, and lessons read back as seeds,
rejection rules and parameter priors.

Reads only. Extraction (turning evaluations into lessons) is memory.lessons; both share the
vocabulary defined here (kinds, failure statuses, dtype keys, shape buckets, arch matching).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from memory.store import Store

PARAM_EFFECT, FAILURE, CHAMPION = "param_effect", "failure", "champion"
KINDS = (PARAM_EFFECT, FAILURE, CHAMPION)
LLM_KINDS = ("llm_failure", "llm_note")  # written by the LLM roles (evo/llm/roles.py), read back like the others
ANY_TEMPLATE = "*"  # scope template of the lesson on the choice of template (param "template")

# Outcomes that say something about a kernel. UNKNOWN (replay had no measurement) says nothing;
# REJECTED (a lesson predicted the failure) is left out so that lessons cannot confirm themselves.
FAILURE_STATUSES = (
    "RENDER_ERROR",
    "COMPILE_ERROR",
    "RESOURCE_ERROR",
    "LAUNCH_ERROR",
    "CRASH",
    "TIMEOUT",
    "WRONG_ANSWER",
    "INPUT_MODIFIED",
)
# SUSPECT (faster than the copy ceiling) is neither a success nor a lesson: it is counted in reports,
# never ranked, never shown to the LLM.
OUTCOME_STATUSES = ("OK", *FAILURE_STATUSES)

# Shape buckets: a dim is small up to the first edge, medium up to the second, else large. An op
# declares its own edges (OpSpec.bucket_edges, passed in by the engine); these are the fallback.
DEFAULT_EDGES = (2048, 8192)
_DTYPE_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int32": "i32"}

# A lesson that did more harm than good (usefulness below this) is no longer applied.
MIN_USEFULNESS = -0.5


def arch_filter(column: str, arch: str) -> tuple[str, list[str]]:
    """SQL condition and parameters matching arch exactly or with a feature suffix ('sm_90' matches 'sm_90a')."""
    return f"({column} = ? OR regexp_full_match({column}, ?))", [arch, re.escape(arch) + "[a-z]+"]


def arch_matches(stored: str, arch: str) -> bool:
    """The Python twin of arch_filter."""
    return stored == arch or re.fullmatch(re.escape(arch) + "[a-z]+", stored) is not None


def sql_literal(value: Any) -> str:
    """A value as a SQL literal, for queries stored as provenance (pasteable into `kfactory sql`)."""
    if isinstance(value, pd.Timestamp):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def dtype_key(dtypes: Mapping[str, str]) -> str:
    """'bf16' when every role has one dtype, else 'w=fp32,x=bf16'."""
    short = {role: _DTYPE_SHORT.get(d, d) for role, d in dtypes.items()}
    if len(set(short.values())) == 1:
        return next(iter(short.values()))
    return ",".join(f"{role}={d}" for role, d in sorted(short.items()))


def shape_bucket(dims: Mapping[str, int], edges: Mapping[str, tuple[int, int]] | None = None) -> dict[str, str]:
    """Each dim as 'small', 'medium' or 'large' (per-dim edges override DEFAULT_EDGES)."""
    out = {}
    for name, v in sorted(dims.items()):
        lo, hi = (edges or {}).get(name, DEFAULT_EDGES)
        out[name] = "small" if v <= lo else "medium" if v <= hi else "large"
    return out


def bucket_label(bucket: Mapping[str, str]) -> str:
    """'M:medium N:large'."""
    return " ".join(f"{k}:{v}" for k, v in sorted(bucket.items()))


def same_value(a: Any, b: Any) -> bool:
    """Equal as JSON (so True is not 1 and 8 is not 8.0)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


# ---------------------------------------------------------------- evaluations as DataFrames

_EVAL_FROM = """
FROM evaluations e
JOIN candidates c ON c.genome_key = e.genome_key
LEFT JOIN builds b ON b.build_key = e.build_key
LEFT JOIN runs r ON r.run_id = e.run_id"""
_EVAL_ARCH = "coalesce(b.arch, r.arch)"


def ok_evaluations(store: Store, op: str, arch: str) -> pd.DataFrame:
    """OK evaluations with a time for op on arch (or its suffixed variants), with template, params and arch."""
    cond, params = arch_filter(_EVAL_ARCH, arch)
    return store.sql(
        f"""SELECT e.eval_id, e.run_id, e.genome_key, e.cell, e.dtypes_json, e.dims_json,
               coalesce(e.fingerprint_class, '') AS fingerprint_class, e.median_us, e.baseline, e.baseline_us,
               e.speedup, e.gbps, e.ceiling_gbps, e.generation, e.created_at,
               c.op, c.template, c.source_hash, c.params_json, {_EVAL_ARCH} AS arch
        {_EVAL_FROM}
        WHERE e.status = 'OK' AND e.median_us > 0 AND c.op = ? AND {cond}
        ORDER BY e.eval_id""",
        [op, *params],
    )


def outcomes(store: Store, op: str, arch: str) -> pd.DataFrame:
    """Every build and evaluation of op on arch that passed or failed, stage 'build' or 'eval'.

    UNKNOWN, REJECTED and other non-outcomes are left out. An evaluation that only repeats its failed
    build's status (the pipeline writes one per cell) is left out too: the build row stands for it.
    """
    marks = ", ".join("?" for _ in OUTCOME_STATUSES)
    bcond, bparams = arch_filter("b.arch", arch)
    econd, eparams = arch_filter(_EVAL_ARCH, arch)
    return store.sql(
        f"""SELECT 'build' AS stage, b.build_key AS row_id, b.genome_key, CAST(NULL AS TEXT) AS cell, b.status,
               b.error, b.arch, b.created_at, c.op, c.template, c.params_json
        FROM builds b JOIN candidates c ON c.genome_key = b.genome_key
        WHERE c.op = ? AND b.status IN ({marks}) AND {bcond}
        UNION ALL
        SELECT 'eval', e.eval_id, e.genome_key, e.cell, e.status, e.error, {_EVAL_ARCH}, e.created_at, c.op,
               c.template, c.params_json
        {_EVAL_FROM}
        WHERE c.op = ? AND e.status IN ({marks}) AND (b.build_key IS NULL OR b.status = 'OK') AND {econd}
        ORDER BY stage, row_id""",
        [op, *OUTCOME_STATUSES, *bparams, op, *OUTCOME_STATUSES, *eparams],
    )


def run_builds(store: Store, run_id: str) -> pd.DataFrame:
    """The builds a run's evaluations used (build_key, status, error, template), in the order the run first used
    them."""
    return store.sql(
        "SELECT b.build_key, any_value(b.status) AS status, any_value(b.error) AS error, "
        "any_value(c.template) AS template, min(e.generation) AS g FROM evaluations e "
        "JOIN builds b ON b.build_key = e.build_key JOIN candidates c ON c.genome_key = e.genome_key "
        "WHERE e.run_id = ? GROUP BY b.build_key ORDER BY g, b.build_key", [run_id])


def first_built(store: Store, run_id: str, build_keys: Sequence[str]) -> int:
    """How many of these builds the store holds under run_id, the run that recorded them first."""
    if not build_keys:
        return 0
    return int(store.sql("SELECT count(*) AS n FROM builds WHERE run_id = ? AND list_contains(?::VARCHAR[], build_key)",
                         [run_id, list(build_keys)]).n[0])


def counts_text(counts: Mapping[str, int]) -> str:
    """'18 OK, 1 UNKNOWN': counts by Status name, most first (then by name), or 'none'."""
    items = sorted(((s, int(n)) for s, n in counts.items() if n), key=lambda x: (-x[1], x[0]))
    return ", ".join(f"{n} {s}" for s, n in items) or "none"


# Each cell's best: its fastest OK evaluation, the earlier one (in evaluation order) on a tie.
_RUN_BESTS_SQL = """
SELECT cell, coalesce(speedup, baseline_us / nullif(median_us, 0)) AS speedup FROM evaluations
WHERE run_id = ? AND status = 'OK' AND median_us IS NOT NULL
QUALIFY row_number() OVER (PARTITION BY cell ORDER BY median_us, generation NULLS LAST, created_at, rowid) = 1
ORDER BY cell
"""


@dataclass(frozen=True)
class RunTotals:
    """A run's counts and geomean speedup as the store holds them: the console's end of run and `kfactory report`
    both print these, in these words, so the two cannot disagree."""

    statuses: Mapping[str, int]  # evaluations by Status name; REJECTED ones were recorded, never run
    reused: int  # evaluations copied from an earlier run's measurement
    builds: int  # distinct builds the run's evaluations used
    builds_compiled: int  # of them, first built by this run; the others were read back from the store
    cells: int  # cells with an OK evaluation
    speedups: tuple[float, ...]  # speedup of each such cell's best, where it has a baseline

    @property
    def evaluations(self) -> int:
        return sum(self.statuses.values())

    @property
    def geomean(self) -> float | None:
        return math.exp(sum(map(math.log, self.speedups)) / len(self.speedups)) if self.speedups else None

    def evaluations_text(self) -> str:
        """'19: 18 measured, 1 reused from earlier runs' measurements (same fingerprint class)'."""
        rejected = self.statuses.get("REJECTED", 0)
        return (f"{self.evaluations}: {self.evaluations - self.reused - rejected} measured, {self.reused} reused "
                "from earlier runs' measurements (same fingerprint class)"
                + (f", {rejected} REJECTED by failure memory (never run)" if rejected else ""))

    def builds_text(self) -> str:
        """'12 used: 9 compiled in this run, 3 reused from the store'."""
        return (f"{self.builds} used: {self.builds_compiled} compiled in this run, "
                f"{self.builds - self.builds_compiled} reused from the store")

    def geomean_text(self) -> str:
        """'1.388 over 2 of 2 cells (cells with a baseline)'."""
        gm = "n/a" if self.geomean is None else f"{self.geomean:.3f}"
        return f"{gm} over {len(self.speedups)} of {self.cells} cells (cells with a baseline)"


def run_totals(store: Store, run_id: str) -> RunTotals:
    """The run's RunTotals, read from its evaluations and builds."""
    st = store.sql("SELECT status, count(*) AS n, count(reused_from) AS reused FROM evaluations WHERE run_id = ? "
                   "GROUP BY status", [run_id])
    b = store.sql(
        "SELECT count(DISTINCT e.build_key) AS used, count(DISTINCT e.build_key) FILTER (WHERE b.run_id = ?) "
        "AS compiled FROM evaluations e LEFT JOIN builds b USING (build_key) WHERE e.run_id = ?",
        [run_id, run_id]).iloc[0]
    best = store.sql(_RUN_BESTS_SQL, [run_id])
    speedups = tuple(float(s) for s in best.speedup.dropna() if s > 0 and math.isfinite(s))
    return RunTotals(dict(zip(st.status, st.n.astype(int))), int(st.reused.sum()), int(b.used), int(b.compiled),
                     len(best), speedups)


def lessons(store: Store, op: str, arch: str, kind: str | None = None) -> pd.DataFrame:
    """Stored lessons for op on arch (prefix match), optionally of one kind."""
    cond, params = arch_filter("arch", arch)
    query = f"SELECT * FROM lessons WHERE op = ? AND {cond}"
    args: list[Any] = [op, *params]
    if kind is not None:
        if kind not in KINDS + LLM_KINDS:
            raise ValueError(f"unknown lesson kind {kind!r}; kinds: {', '.join(KINDS + LLM_KINDS)}")
        query += " AND kind = ?"
        args.append(kind)
    return store.sql(query + " ORDER BY kind, usefulness DESC, support DESC, lesson_id", args)


def scope_label(kind: str, scope: Mapping[str, Any]) -> str:
    """A short readable scope: 'warp_row.vec bf16 M:medium N:small', 'cta_row RESOURCE_ERROR', a cell."""
    keys = set(scope)
    if kind == PARAM_EFFECT and {"template", "param", "dtype", "bucket"} <= keys:
        return f"{scope['template']}.{scope['param']} {scope['dtype']} {bucket_label(scope['bucket'])}"
    if kind == FAILURE and {"template", "status"} <= keys:
        return f"{scope['template']} {scope['status']}"
    if kind == CHAMPION and scope.get("level") == "cell" and "cell" in keys:
        return str(scope["cell"])
    if kind == CHAMPION and {"dtype", "bucket"} <= keys:
        return f"{scope['dtype']} {bucket_label(scope['bucket'])}"
    return json.dumps(scope, sort_keys=True)  # lessons written by others (e.g. the LLM lesson writer)


def _structured(text: Any) -> dict[str, Any]:
    """A lesson's structured_json as a dict ({} where it holds anything else)."""
    d = json.loads(text) if isinstance(text, str) else {}
    return d if isinstance(d, dict) else {}


def _not_significant(structured: Mapping[str, Any]) -> bool:
    """True for a lesson whose own test found no significant effect (param effects carry `significant`)."""
    return structured.get("significant") is False


def _effect_pct(structured: Mapping[str, Any]) -> float:
    """A param effect's size (% faster, best value over the runner-up); 0 for lessons without one."""
    x = structured.get("faster_pct")
    return abs(float(x)) if isinstance(x, (int, float)) and math.isfinite(x) else 0.0


def lessons_table(store: Store, op: str, arch: str, kind: str | None = None) -> pd.DataFrame:
    """What `kfactory lessons --op OP --arch ARCH [--kind KIND]` prints, ranked by evidence: lessons whose test
    found no significant effect last; within each group most useful first, then largest effect, best supported."""
    df = lessons(store, op, arch, kind)
    cols = ["kind", "lesson_id", "scope", "text", "support", "usefulness", "created_run", "confirmed_run"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    scope = [scope_label(k, json.loads(s)) for k, s in zip(df.kind, df.scope_json)]
    structured = [_structured(s) for s in df.structured_json]
    # usefulness alone put 'not significant' 0% effects on top (+0.99 earned while the search followed them):
    # a lesson is only as good as its evidence, so significance ranks first
    df = df.assign(scope=scope, _weak=[_not_significant(s) for s in structured],
                   _effect=[_effect_pct(s) for s in structured])
    df = df.sort_values(["_weak", "usefulness", "_effect", "support", "kind", "lesson_id"],
                        ascending=[True, False, False, False, True, True], kind="stable")
    return df[cols].reset_index(drop=True)


# ---------------------------------------------------------------- lessons used by the search

CellLike = Any  # an ops.spec.Cell (dtypes_dict(), dims_dict()) or a (dtypes, dims) pair of mappings


def _cell_facts(cell: CellLike) -> tuple[dict[str, str], dict[str, int]]:
    if hasattr(cell, "dtypes_dict"):
        return dict(cell.dtypes_dict()), dict(cell.dims_dict())
    dtypes, dims = cell
    return dict(dtypes), dict(dims)


def dims_distance(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    """Euclidean distance of log2 dims; a dim only one side has counts as 10 doublings."""
    d2 = 0.0
    for k in set(a) | set(b):
        if k in a and k in b:
            d2 += (math.log2(max(a[k], 1)) - math.log2(max(b[k], 1))) ** 2
        else:
            d2 += 100.0
    return math.sqrt(d2)


@dataclass(frozen=True)
class Seed:
    """A warm-start genome: a past champion, the lesson that holds it and how near its cell is."""

    template: str
    params: Mapping[str, Any]
    genome_key: str
    source_hash: str | None
    lesson_id: str
    cell: str
    same_dtype: bool
    distance: float
    dtype: str = ""  # the champion's cell: dtype key and dims
    dims: Mapping[str, int] = field(default_factory=dict)


def warm_start(
    store: Store, op: str, arch: str, cells: Sequence[CellLike], k: int, min_usefulness: float = MIN_USEFULNESS
) -> list[Seed]:
    """Up to k distinct champions of the stored cells nearest the target cells (same dtype first, then log-distance)."""
    df = lessons(store, op, arch, CHAMPION)
    df = df[df.usefulness >= min_usefulness]
    stored = []
    for r in df.itertuples(index=False):
        s = json.loads(r.structured_json)
        if s.get("level") == "cell" and s.get("top"):
            stored.append((r.lesson_id, r.usefulness, s))
    ranked: list[list[tuple[tuple[Any, ...], Seed]]] = []
    for cell in cells:
        dtypes, dims = _cell_facts(cell)
        key = dtype_key(dtypes)
        options = []
        for lesson_id, usefulness, s in stored:
            same, dist = s["dtype"] == key, dims_distance(dims, s["dims"])
            for rank, g in enumerate(s["top"]):
                seed = Seed(
                    g["template"], g["params"], g["genome_key"], g.get("source_hash"), lesson_id, s["cell"], same, dist,
                    s["dtype"], s["dims"],
                )
                options.append(((not same, round(dist, 9), rank, -usefulness, g["genome_key"]), seed))
        ranked.append([seed for seed in sorted(options, key=lambda o: o[0])])
    out: list[Seed] = []
    seen: set[str] = set()
    # Round-robin over the target cells so that every cell gets its nearest champion before any gets a second.
    for pos in range(max((len(r) for r in ranked), default=0)):
        for options in ranked:
            if pos < len(options) and len(out) < k:
                _, seed = options[pos]
                if seed.genome_key not in seen:
                    seen.add(seed.genome_key)
                    out.append(seed)
    return out


def warm_start_seeds(
    store: Store, op: str, arch: str, cells: Sequence[CellLike], k: int
) -> list[tuple[str, dict[str, Any]]]:
    """(template, params) of up to k champions of the nearest stored shapes and dtypes, for the same op and arch."""
    return [(s.template, dict(s.params)) for s in warm_start(store, op, arch, cells, k)]


@dataclass(frozen=True)
class FailureRule:
    """template + condition (param values) -> predicted status, from a failure lesson."""

    lesson_id: str
    template: str
    condition: tuple[tuple[str, Any], ...]
    predicts: str
    precision: float
    support: int

    def matches(self, template: str, params: Mapping[str, Any]) -> bool:
        return template == self.template and all(k in params and same_value(params[k], v) for k, v in self.condition)


@dataclass(frozen=True)
class FailurePredictor:
    """Call with (template, params): (lesson_id, predicted status) of the strongest matching rule, or None."""

    rules: tuple[FailureRule, ...]

    def __call__(self, template: str, params: Mapping[str, Any]) -> tuple[str, str] | None:
        for rule in self.rules:
            if rule.matches(template, params):
                return rule.lesson_id, rule.predicts
        return None


def failure_predictor(
    store: Store,
    op: str,
    arch: str,
    min_precision: float = 0.9,
    min_support: int = 5,
    min_usefulness: float = MIN_USEFULNESS,
) -> Callable[[str, Mapping[str, Any]], tuple[str, str] | None]:
    """A predictor from the failure lessons of op on arch whose precision and support reach the thresholds."""
    df = lessons(store, op, arch, FAILURE)
    rules = []
    for r in df[df.usefulness >= min_usefulness].itertuples(index=False):
        s = json.loads(r.structured_json)
        # LLM-written failure lessons carry a Jinja expression as condition; only param=value rules apply here.
        if not isinstance(s.get("condition"), dict) or "precision" not in s:
            continue
        if s["precision"] >= min_precision and s["support"] >= min_support:
            rules.append(
                FailureRule(
                    r.lesson_id,
                    s["template"],
                    tuple(sorted(s["condition"].items())),
                    s["predicts"],
                    float(s["precision"]),
                    int(s["support"]),
                )
            )
    rules.sort(key=lambda x: (-x.precision, -x.support, len(x.condition), x.lesson_id))
    return FailurePredictor(tuple(rules))


def _effect_lessons(
    store: Store, op: str, arch: str, cells: Sequence[CellLike] | None, min_usefulness: float,
    edges: Mapping[str, tuple[int, int]] | None = None,
) -> list[tuple[str, float, dict[str, Any], dict[str, Any]]]:
    """(lesson_id, usefulness, scope, structured) of the param-effect lessons that apply to the cells."""
    df = lessons(store, op, arch, PARAM_EFFECT)
    found = [
        (r.lesson_id, float(r.usefulness), json.loads(r.scope_json), json.loads(r.structured_json))
        for r in df[df.usefulness >= min_usefulness].itertuples(index=False)
    ]
    # Only lessons with per-value effects (an LLM-written lesson of this kind may carry text alone).
    found = [f for f in found if {"template", "param", "dtype", "bucket"} <= set(f[2]) and "values" in f[3]]
    if not cells:
        return found
    wanted = set()
    for cell in cells:
        dtypes, dims = _cell_facts(cell)
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
