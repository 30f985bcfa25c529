"""What an op must declare for the engine to build, check, time and learn about it.

`problems(spec)` lists what is missing or inconsistent; an empty list means the engine needs nothing
else. An op with templates (templates/<op>/) must also be runnable: input kinds for the gate, a
baseline by name, and device hooks (ops/<op>/device.py: SOURCE, reference, tail_width, baselines, and
peer_outputs, which maps a peer's return value to the op's outputs so the gate can check it).
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path

from evo.core.registry import ROOT as OPS_ROOT
from evo.core.spec import DType, OpSpec, Role

TEMPLATES = OPS_ROOT.parent / "templates"
DEVICE_HOOKS = ("reference", "tail_width", "baselines", "peer_outputs")


def has_templates(op: str) -> bool:
    return any((TEMPLATES / op).glob("*.cu.j2"))


def has_device_hooks(op: str) -> bool:
    return (OPS_ROOT / op / "device.py").is_file()


def problems(spec: OpSpec) -> list[str]:
    """Every reason the engine could not run this op ([] when it can)."""
    bad: list[str] = []
    ins = [t for t in spec.tensors if t.role is Role.IN]
    outs = [t for t in spec.tensors if t.role is Role.OUT]
    if not ins or not outs:
        bad.append("needs at least one input and one output tensor")
    for t in spec.tensors:
        if not isinstance(t.dtype, DType) and t.dtype not in spec.dtype_roles and t.fallback not in spec.dtype_roles:
            bad.append(f"tensor {t.name}: dtype role {t.dtype!r} is not in dtype_roles {spec.dtype_roles}")
    cells = spec.matrix()
    if not cells or len(set(cells)) != len(cells):
        bad.append("matrix() must give distinct cells")
    if not spec.edge_cells():
        bad.append("edge_cells() is empty")
    for c in cells[:64]:
        dims = c.dims_dict()
        missing = sorted({d for t in spec.tensors for d in t.dims} - set(dims))
        if missing:
            bad.append(f"cell {c.label()}: no value for dims {missing}")
            continue
        if not spec.bytes_moved(c) > 0:
            bad.append(f"cell {c.label()}: bytes_moved must be > 0")
        for t in outs:
            tol = spec.tolerance(c, t.name)
            if not (tol.atol >= 0 and tol.rtol >= 0 and tol.rel_norm > 0 and math.isfinite(tol.rel_norm)):
                bad.append(f"cell {c.label()}: tolerance of {t.name} must be finite and non-negative")
    for d, (lo, hi) in spec.bucket_edges.items():
        if not 0 < lo < hi:
            bad.append(f"bucket_edges[{d!r}] must be 0 < lo < hi, got {(lo, hi)}")
    if has_templates(spec.name) or has_device_hooks(spec.name):
        bad += _runnable_problems(spec)
    return bad


def _runnable_problems(spec: OpSpec) -> list[str]:
    bad: list[str] = []
    if not spec.fills:
        return [f"op {spec.name} has templates but declares no input kinds (fills) for the gate"]
    filled = [t for t in spec.tensors if t.role is Role.IN]
    needed = {t.name for t in filled if not t.optional}
    may = {t.name for t in filled if t.optional}  # filled when a variant uses them
    ints = {t.name for t in filled if t.dtype is DType.INT32}  # offsets (cu_seqlens), nothing else
    dims = {d for t in spec.tensors for d in t.dims}
    for kind, specs in spec.fills.items():
        if not needed <= set(specs) <= needed | may:
            bad.append(f"input kind {kind!r} fills {sorted(specs)}, expected {sorted(needed)}"
                       + (f" (and may fill {sorted(may)})" if may else ""))
        for name, f in specs.items():
            if (name in ints) != bool(f.offsets):
                bad.append(f"input kind {kind!r}: {name} needs " + ("an offsets fill (int32)" if name in ints
                                                                    else "a value fill, not offsets"))
            elif f.offsets and f.offsets not in dims:
                bad.append(f"input kind {kind!r}: offsets of {name} end at {f.offsets!r}, not a dim of the op")
    if not set(spec.timing_kinds) <= set(spec.fills):
        bad.append(f"timing_kinds {spec.timing_kinds} are not all input kinds")
    rec = spec.recurrence
    if rec is not None:
        by_name = {t.name: t for t in spec.tensors}
        s_in, s_out = by_name.get(rec.state_in), by_name.get(rec.state_out)
        if not (s_in and s_out and s_in.role is Role.IN and s_out.role is Role.OUT and s_in.dims == s_out.dims):
            bad.append(f"recurrence: {rec.state_in!r} must be an input and {rec.state_out!r} an output of its dims")
        if rec.kind not in spec.fills or rec.token not in dims:
            bad.append(f"recurrence: kind {rec.kind!r} must be an input kind and token {rec.token!r} a dim")
    if not spec.baselines:
        bad.append("no baseline by name (baselines)")
    for c in spec.matrix()[:8]:
        for g in spec.gate_cells(c):
            if g.dtypes != c.dtypes:
                bad.append(f"gate cell {g.label()} of {c.label()} changes the dtypes")
    try:
        mod = importlib.import_module(f"ops.{spec.name}.device")
    except ImportError as e:
        return bad + [f"no device hooks module ops/{spec.name}/device.py ({e})"]
    bad += [f"device hooks lack {h}()" for h in DEVICE_HOOKS if not callable(getattr(mod, h, None))]
    src = getattr(mod, "SOURCE", None)
    if not (isinstance(src, Path) and src.is_file()):
        bad.append("device hooks lack SOURCE (the float64 reference's .cu file)")
    if callable(getattr(mod, "reference", None)):
        c = spec.matrix()[0]
        outs = {t.name for t in spec.tensors if t.role is Role.OUT}
        scaled = tuple(getattr(mod, "SCALED", ()))
        bad += [f"device hooks' SCALED names {n!r}, not an output" for n in scaled if n not in outs]
        if scaled and not callable(getattr(mod, "error_scales", None)):
            bad.append("device hooks name SCALED outputs but lack error_scales() (their numpy mirror)")
        names = ({t.name for t in spec.tensors} | {f"ref:{n}" for n in outs}
                 | {f"scale:{n}" for n in scaled if n in outs})
        for launch in mod.reference(c.dims_dict(), c.dtypes_dict(), spec.scalar_values(c)):
            for kind, v in launch[3]:
                if kind == "buf" and v not in names:
                    bad.append(f"device reference binds unknown buffer {v!r}")
    return bad
