"""The exported package's data documents: dispatch.json (what the runtime reads) and provenance.json
(where every kernel and number comes from)."""

from __future__ import annotations

import math
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from evo.export.kernels import Kernel, sha256, template_id
from evo.export.runs import Entry, RunTable
from evo.templates.template import LaunchDecl, TemplateDef
from evo.core.registry import get_op

FORMAT = 1
_VERSIONED = ("cuda-core", "cuda-bindings", "cuda-pathfinder", "jinja2", "duckdb", "numpy")


def template_file(op: str, t: TemplateDef) -> str:
    return f"templates/{op}/{t.name}.{t.source_hash[:12]}.cu.j2"


def kernel_files(op: str, k: Kernel, arch: str) -> tuple[str, str]:
    return f"kernels/{op}/{k.id}.cu", f"kernels/{op}/{k.id}.{arch}.cubin"


def template_doc(op: str, t: TemplateDef) -> dict[str, Any]:
    return {"name": t.name, "source_hash": t.source_hash, "file": template_file(op, t), "description": t.description,
            "specialize": list(t.specialize), "space": {k: list(v) for k, v in t.space}, "defaults": dict(t.defaults),
            "constraints": {name: e.text for name, e in t.constraints},
            "launches": [_launch_doc(d) for d in t.launches],
            "workspaces": {name: e.text for name, e in t.workspaces}}


def _launch_doc(d: LaunchDecl) -> dict[str, Any]:
    """A declared launch as the package's table reads it; `when`, `stream`, `fork_after` and `pdl` only where set,
    so a plan without them exports as before."""
    doc: dict[str, Any] = {"kernel": d.kernel, "grid": [e.text for e in d.grid], "block": [e.text for e in d.block],
                           "smem": d.smem.text, "args": list(d.args)}
    if d.when is not None:
        doc["when"] = d.when.text
    if d.stream != "main":
        doc |= {"stream": d.stream, "fork_after": d.fork_after}
    if d.pdl is not None:
        doc["pdl"] = d.pdl.text
    return doc


def _entry_doc(e: Entry, kid: str) -> dict[str, Any]:
    return {"cell": e.cell, "dtypes": e.dtypes, "dims": e.dims, "build": kid,
            "template": f"{e.genome.template}-{e.genome.source_hash[:12]}", "params": e.genome.params_dict(),
            "genome_key": e.genome.key(), "median_us": e.median_us, "p10_us": e.p10_us, "p90_us": e.p90_us,
            "samples": e.samples, "gbps": e.gbps, "ceiling_gbps": e.ceiling_gbps, "baseline": e.baseline,
            "baseline_us": e.baseline_us, "speedup": e.speedup, "eval_id": e.eval_id, "measured_in": e.measured_in}


def op_document(run: RunTable, kernels: Sequence[Kernel], cell_kernel: dict[str, str]) -> dict[str, Any]:
    """One op's part of dispatch.json: its run(s), tensors, scalars, the dims a cell may lack with their
    defaults (a variant's switches: a template specializing on one is rendered with it), templates,
    builds, entries."""
    spec = get_op(run.op)
    templates = {template_id(k.template): template_doc(run.op, k.template) for k in kernels}
    builds = {}
    for k in kernels:
        cu, cubin = kernel_files(run.op, k, run.arch)
        builds[k.id] = {"template": template_id(k.template), "params": k.params, "dtypes": k.dtypes,
                        "consts": k.consts, "cu": cu, "cubin": cubin, "cu_sha256": sha256(k.source),
                        "cubin_sha256": sha256(k.cubin), "cubin_from": k.cubin_from, "compiler": k.compiler,
                        "build_key": k.build_key, "regs": k.regs, "spill_stores": k.spill_stores}
    tensors = [{"name": t.name, "dims": list(t.dims), "dtype": t.dtype if isinstance(t.dtype, str) else t.dtype.value,
                "role": t.role.value} for t in spec.tensors]
    scalars = [{"name": s.name, "type": "f32" if s.kind is float else "i32"} for s in spec.scalars]
    return {"run_id": run.run["run_id"], "run_ids": list(run.run_ids), "arch": run.arch, "tensors": tensors,
            "scalars": scalars, "dim_defaults": dict(spec.dim_defaults), "templates": templates, "builds": builds,
            "entries": [_entry_doc(e, cell_kernel[e.cell]) for e in run.entries], "matrix": matrix_doc(spec)}


def matrix_doc(spec: Any) -> list[dict[str, Any]]:
    """The op's published cells (its matrix and named matrices, not its edge cells): what the package's benchmark
    measures, whether the search covered a cell or not; each names its matrix ("" for the op's own, else the named
    matrix that lists it first)."""
    named: dict[Any, str] = {}
    for name, cells in (("", spec.matrix()), *((n, f()) for n, f in spec.matrices.items())):
        for c in cells:
            named.setdefault(c, name)
    return [{"cell": c.label(), "dtypes": c.dtypes_dict(), "dims": c.dims_dict(), "matrix": m} for c, m in named.items()]


def dispatch_document(name: str, ops: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"format": FORMAT, "package": name, "ops": ops}


def _geomean(values: Sequence[float | None]) -> float | None:
    v = [x for x in values if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def provenance_document(name: str, runs: Sequence[RunTable], kernels: dict[str, Sequence[Kernel]],
                        compiler: str) -> dict[str, Any]:
    """Runs (with their configs), the fingerprints of the measurements, and the versions used to export."""
    ops = {}
    for run in runs:
        fps = {repr(sorted(e.fingerprint.items())): e.fingerprint for e in run.entries}
        ops[run.op] = {
            "run": run.run, "table_from": run.table_from, "cells": len(run.entries),
            "measured_in_runs": sorted({e.measured_in for e in run.entries}),
            "sources": sorted({e.source for e in run.entries}),
            "fingerprints": [fps[k] for k in sorted(fps)],
            "fingerprint_classes": sorted({e.fingerprint_class for e in run.entries}),
            "geomean_speedup_vs_baseline": _geomean([e.speedup for e in run.entries]),
            "baselines": sorted({e.baseline for e in run.entries if e.baseline}),
            "kernels": {k.id: {"cubin_from": k.cubin_from, "compiler": k.compiler, "rebuilt_with": k.rebuilt_with}
                        for k in kernels[run.op]},
            "results_file": f"data/results/{run.op}_evaluations.csv",
        }
        if run.parts:  # several runs merged into the op's table: each with its cells
            ops[run.op]["runs"] = [{"run": p.run, "table_from": p.table_from, "cells": [e.cell for e in p.entries]}
                                   for p in run.parts]
    return {"format": FORMAT, "package": name, "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "factory": {"git_commit": _git_commit(), "nvrtc": compiler,
                        "versions": {d: _version(d) for d in _VERSIONED}},
            "ops": ops}
