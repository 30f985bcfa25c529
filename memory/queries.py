"""What the search and the report ask the lesson store: evaluations as DataFrames, a run's totals, and the
stored lessons (the search's warm start, failure memory and priors, in evo/search, apply them).

Reads only. Extraction (turning evaluations into lessons) is memory.lessons; both share the
vocabulary defined here (kinds, failure statuses, dtype keys, shape buckets, arch matching).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


# Verdicts a gate's own defect produced: left out of what lessons learn from (the store keeps them). Gate "10" checked
# a plan with a cluster launch in its round beside a kernel holding most SMs without launching it, so the outputs
# it checked were its poison and every such plan was WRONG_ANSWER there (evo/measure/gate.py, gate "11").
VOID_VERDICTS = ("NOT (e.status = 'WRONG_ANSWER' AND e.error LIKE '%beside a kernel holding most SMs%' "
                 "AND coalesce(json_extract_string(e.fingerprint_json, '$.gate'), '') = '10')")


def outcomes(store: Store, op: str, arch: str) -> pd.DataFrame:
    """Every build and evaluation of op on arch that passed or failed, stage 'build' or 'eval'.

    UNKNOWN, REJECTED and other non-outcomes are left out. An evaluation that only repeats its failed
    build's status (the pipeline writes one per cell) is left out too: the build row stands for it. So are the
    verdicts of a gate's defect (VOID_VERDICTS).
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
              AND {VOID_VERDICTS}
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


PACE_RUNS = 5  # the recent GPU runs whose pace a run's first generation takes


def gpu_pace(store: Store, op: str, arch: str, run_id: str) -> float | None:
    """Seconds an evaluation took, builds included, in this op's recent GPU runs on this arch other than run_id:
    the median over the last PACE_RUNS of (a run's search time / its evaluations measured on the GPU, not reused);
    None without one (evo.loop.search sizes a run's first generation with it)."""
    df = store.sql(
        "SELECT r.elapsed_s / count(*) AS pace FROM runs r JOIN evaluations e ON e.run_id = r.run_id "
        "WHERE r.op = ? AND r.arch = ? AND r.run_id <> ? AND r.elapsed_s > 0 AND e.source = 'gpu' "
        "AND e.reused_from IS NULL GROUP BY r.run_id, r.elapsed_s, r.created_at ORDER BY r.created_at DESC LIMIT ?",
        [op, arch, run_id, PACE_RUNS])
    return float(df.pace.median()) if len(df) else None
