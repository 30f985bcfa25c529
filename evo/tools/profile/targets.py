"""Profile targets: [[target]] tables of a TOML file, each resolved to (op, template, params, cell), planned as the
gate would launch it, built by NVRTC, and run on this GPU."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evo.tools.errors import ToolInputError, read_json, require_file

ARCH = "sm_90a"


@dataclass(frozen=True)
class Target:
    name: str
    op: str
    template: str
    params: dict
    cell: str


def _point(t: dict, path: Path, where: str) -> tuple[str, dict]:
    """(template, params) of a target: its own, or its dispatch table's entry for its cell."""
    if "dispatch" in t:
        table = read_json(path.parent / t["dispatch"]).get("dispatch", {})
        if t["cell"] not in table:
            raise ToolInputError(f"{where}: {t['dispatch']} has no entry for {t['cell']!r}")
        return table[t["cell"]]["template"], dict(table[t["cell"]]["params"])
    if isinstance(t.get("template"), str):
        return t["template"], dict(t.get("params", {}))
    raise ToolInputError(f"{where}: needs template (and params) or dispatch")


def load_targets(path: Path) -> list[Target]:
    """The targets of a TOML file, each resolved and planned; a clear error for a target without a cell, an
    unknown op or template, a dispatch table without the cell, a point illegal on its cell, or two targets of one
    name (before any GPU time is spent)."""
    from evo.core.registry import get_op

    try:
        doc = tomllib.loads(require_file(path, "targets file").read_text())
    except tomllib.TOMLDecodeError as e:
        raise ToolInputError(f"{path} is not TOML ({e})") from None
    out: list[Target] = []
    for i, t in enumerate(doc.get("target", [])):
        where = f"{path}: target {i + 1} ({t.get('name', '?')})"
        for key in ("name", "op", "cell"):
            if not isinstance(t.get(key), str):
                raise ToolInputError(f"{where}: needs a string {key!r}")
        op = get_op(t["op"])
        if t["cell"] not in {c.label() for c in op.all_cells()}:
            raise ToolInputError(f"{where}: cell {t['cell']!r} is not one of op {op.name}'s cells")
        target = Target(t["name"], op.name, *_point(t, path, where), t["cell"])
        try:
            plan(target)
        except (KeyError, ValueError) as e:
            raise ToolInputError(f"{where}: {e}") from None
        out.append(target)
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise ToolInputError(f"{path}: target names repeat: {sorted(n for n in names if names.count(n) > 1)}")
    if not out:
        raise ToolInputError(f"{path}: no [[target]]")
    return out


def plan(t: Target, build: Any = None) -> tuple[Any, Any, Any]:
    """(genome, job, cell) of a target (evo.measure.launches.plan_job)."""
    from evo.loop.pipeline import arch_number
    from evo.measure.launches import plan_job
    from evo.core.registry import get_op

    op = get_op(t.op)
    c = next((c for c in op.all_cells() if c.label() == t.cell), None)
    if c is None:
        raise ToolInputError(f"cell {t.cell!r} is not one of op {op.name}'s cells")
    g, job = plan_job(op, t.template, c, t.params, arch_number(ARCH), build)
    return g, job, c


def build(t: Target) -> Any:
    """The NVRTC build of a target at sm_90a; raises RuntimeError with the compiler's error."""
    from evo.build.nvrtc import compile_one, prepare
    from evo.templates.template import load_templates

    g, _, c = plan(t)
    b = compile_one(prepare(load_templates(t.op)[t.template], g, ARCH, c.dtypes_dict(), c.dims_dict()))
    if not b.status.ok:
        raise RuntimeError(f"{t.name}: build failed: {b.error}")
    return b


def run(t: Target, times: int) -> dict:
    """Build, plan, check and run the target's launches `times` rounds on this GPU."""
    from cuda.core import ObjectCode

    from evo.measure.launches import run_launches
    from evo.measure.worker import Worker

    b = build(t)
    g, job, _ = plan(t, b)
    w = Worker()
    mod, ref_obj = w._op(t.op)
    obj = ObjectCode.from_cubin(b.cubin)
    geo = run_launches(w, obj, ref_obj, mod, job, times)
    return {"target": t.name, "params": g.params_dict(), "launches": geo, "regs": {k: r.regs for k, r in b.resources},
            "fingerprint": dict(w.fingerprint)}


def target_from_args(op: str, template: str, cell: str, params: str) -> Target:
    """A target named 'run' from command-line values (params as JSON)."""
    try:
        p = json.loads(params)
    except json.JSONDecodeError as e:
        raise ToolInputError(f"--params is not JSON ({e})") from None
    if not isinstance(p, dict):
        raise ToolInputError("--params must be a JSON object")
    return Target("run", op, template, p, cell)
