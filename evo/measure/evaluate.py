"""Build EvalJobs from (template, genome, build, cell): the launch plan bound to the op's tensors."""

from __future__ import annotations

import math
import random
from typing import Mapping, Sequence

from evo.build.nvrtc import BuildResult
from evo.core.genome import Genome
from evo.measure.draws import scalar_note, scalar_rng
from evo.measure.jobs import BufferDecl, DecodeLoop, EvalJob, GateCell, LaunchJob, Timing
from evo.templates.template import Launch, TemplateDef
from evo.core.spec import Cell, OpSpec, TensorSpec


def arg_name(arg: str) -> tuple[str, bool]:
    """A launch arg's name, and whether it is conditional ("bias?": a tensor bound only on the cells the
    op says use it, a null pointer on the others)."""
    name = arg.partition(":")[0]
    return name.removesuffix("?"), name.endswith("?")


def bound_tensors(op: OpSpec, launches: Sequence[Launch], cell: Cell) -> tuple[TensorSpec, ...]:
    """The op's tensors a launch plan uses on `cell`: every required one; an optional one when a launch
    names it, or names it conditionally ("name?") and the op says the cell uses it (a template that
    leaves it out is the op's variant without it)."""
    named: dict[str, bool] = {}  # name -> conditional everywhere it is named
    for ln in launches:
        for a in ln.args:
            name, cond = arg_name(a)
            named[name] = named.get(name, True) and cond
    return tuple(t for t in op.tensors
                 if not t.optional or (t.name in named and (not named[t.name] or op.uses(cell, t.name))))


def unbound_tensors(op: OpSpec, launches: Sequence[Launch], cell: Cell) -> tuple[str, ...]:
    """The tensors the cell's variant uses that no launch of the plan names: every required one, and every
    optional one whose used_when holds on the cell (an optional tensor without used_when stays optional)."""
    named = {arg_name(a)[0] for ln in launches for a in ln.args}
    return tuple(t.name for t in op.tensors if t.name not in named
                 and (not t.optional or (t.used_when is not None and t.used_when(cell))))


def variant_gap(op: OpSpec, tdef: TemplateDef, genome: Genome, cell: Cell, arch: int) -> str:
    """'' when the genome's plan binds every tensor of the cell's variant, else why its result on the cell is
    INVALID (one line): a plan that leaves one out computes another op than the cell's."""
    launches, _ = tdef.plan(genome.params_dict(), arch, cell.dtypes_dict(), cell.dims_dict())
    missing = unbound_tensors(op, launches, cell)
    if not missing:
        return ""
    return (f"{tdef.name}'s launch plan leaves out {', '.join(missing)}, which the variant of cell {cell.label()} "
            "uses: not this cell's op")


def bind_cell(op: OpSpec, tdef: TemplateDef, genome: Genome, cell: Cell, arch: int,
              scalars: Mapping[str, float | int] | None = None
              ) -> tuple[tuple[LaunchJob, ...], tuple[BufferDecl, ...], tuple[tuple[str, float], ...]]:
    """The genome's launch plan on one cell, bound to the op's tensors (optional ones only when the plan
    uses them on this cell: no buffer for the others, a null pointer for a conditional arg), dims and
    scalars (the op's defaults unless given)."""
    dims = cell.dims_dict()
    launches, workspaces = tdef.plan(genome.params_dict(), arch, cell.dtypes_dict(), dims)
    scalars = op.scalar_values(cell, scalars)
    buffers = [BufferDecl(t.name, t.resolve_dtype(cell).value, t.shape(cell), t.role.value)
               for t in bound_tensors(op, launches, cell)]
    buffers += [BufferDecl(name, "uint8", (nbytes,), "ws") for name, nbytes in workspaces.items()]
    names = {b.name for b in buffers}
    tensors = {t.name for t in op.tensors}
    scalar_kinds = {s.name: ("f32" if s.kind is float else "i32") for s in op.scalars}
    jobs = []
    for ln in launches:
        args = []
        for a in ln.args:
            name, cond = arg_name(a)
            typ = a.partition(":")[2]
            if name in names:
                args.append(("buf", name))
            elif cond and name in tensors:  # a tensor this cell's variant does not use
                args.append(("ptr", 0))
            elif cond:
                raise KeyError(f"template {tdef.name}: launch arg {a!r} is conditional, but {name!r} is not a tensor "
                               f"of {op.name}")
            elif name in dims:
                args.append((typ or "i32", dims[name]))
            elif name in scalars:
                args.append((typ or scalar_kinds[name], scalars[name]))
            else:
                raise KeyError(f"template {tdef.name}: launch arg {name!r} is not a tensor, dim or scalar of {op.name}")
        jobs.append(LaunchJob(ln.kernel, ln.grid, ln.block, ln.smem, tuple(args), ln.stream, ln.fork_after, ln.pdl))
    return tuple(jobs), tuple(buffers), tuple(sorted(scalars.items()))


def make_job(
    op: OpSpec,
    tdef: TemplateDef,
    genome: Genome,
    build: BuildResult,
    cell: Cell,
    arch: int,
    seed: int,
    timing: Timing | None,
    baseline: bool = True,
    job_id: str = "",
    gate_cells: Sequence[Cell] = (),
    stress_launches: int = 4,
    baselines: Sequence[str] | None = None,
    secret: int = 0,
) -> EvalJob:
    """One job verifying (and timing, if `timing`) a built genome on one cell, with every input kind
    the op declares, and on `gate_cells` (which must share the build) with the same cubin. `baselines`
    names the peers timed beside it (default: the op's first). Optional tensors the genome's plan does
    not bind are neither allocated, filled nor checked; a plan that leaves out a tensor of the cell's
    variant is refused (variant_gap). With a `secret` (evo.measure.draws.new_secret), each gate cell's scalars
    are drawn from the op's declared ranges (its label names them), a recurrent op's decode cell gets a decode
    loop of a drawn length (decode_loop), and the gate draws guards and fills from the secret too."""
    why = variant_gap(op, tdef, genome, cell, arch)
    if why:
        raise ValueError(why)
    launches, buffers, scalars = bind_cell(op, tdef, genome, cell, arch)
    present = {b.name for b in buffers}
    draws = scalar_rng(secret) if secret else None
    gate = []
    for gc in gate_cells:
        drawn = op.drawn_scalars(gc, draws) if draws else None
        gl, gb, gs = bind_cell(op, tdef, genome, gc, arch, drawn)
        if {b.name for b in gb} != present:  # the job's left_out and fills are the main cell's
            raise ValueError(f"gate cell {gc.label()} of {cell.label()} binds {sorted(b.name for b in gb)}, "
                             f"the cell {sorted(present)}: not the same variant")
        gate.append(GateCell(gc.label() + scalar_note(op, drawn), tuple(sorted(gc.dims_dict().items())), gl, gb, gs))
    tols = tuple(
        (t.name, (tol.atol, tol.rtol, tol.rel_norm))
        for t in op.outputs() if t.name in present
        for tol in [op.tolerance(cell, t.name)]
    )
    return EvalJob(
        job_id=job_id or f"{genome.key()[:12]}:{cell.label()}",
        op=op.name,
        dims=tuple(sorted(cell.dims_dict().items())),
        dtypes=tuple(sorted(cell.dtypes_dict().items())),
        cubin=build.cubin,
        launches=launches,
        buffers=buffers,
        scalars=scalars,
        kinds=op.gate_kinds(),
        tolerances=tols,
        seed=seed,
        timing=timing,
        baseline=baseline,
        stress_launches=stress_launches,
        fills=tuple((k, tuple(sorted((n, f) for n, f in specs.items() if n in present)))
                    for k, specs in op.fills.items()),
        timing_kinds=op.timing_kinds,
        bytes_moved=op.bytes_moved(cell),
        gate=tuple(gate),
        loop=() if draws is None else decode_loop(op, tdef, genome, cell, arch, draws, present),
        baselines=tuple(op.baselines[:1] if baselines is None else baselines),
        left_out=tuple(t.name for t in op.tensors if t.name not in present),
        secret=secret,
        causal=tuple((t.name, t.dims.index(op.causal.dim)) for t in op.tensors
                     if op.causal and t.name in present and op.causal.dim in t.dims),
    )



def decode_loop(op: OpSpec, tdef: TemplateDef, genome: Genome, cell: Cell, arch: int, rng: random.Random,
                present: set[str]) -> tuple[DecodeLoop, ...]:
    """The op's decode loop on `cell` (ops.spec.Recurrence) of a length drawn from `rng`, where the cell is a
    decode step, the template admits the one-token cell with the same build, and binds the same tensors there."""
    rec = op.recurrence
    if rec is None:
        return ()
    steps = rng.randint(*rec.steps)
    cells = rec.loop(cell, steps)
    if cells is None:
        return ()
    step, seq = cells
    params = genome.params_dict()
    if (any(op.dim_value(step, d) != op.dim_value(cell, d) for d in tdef.specialize)
            or not tdef.is_valid(params, arch, step.dtypes_dict(), step.dims_dict())):
        return ()
    drawn = op.drawn_scalars(step, rng)
    launches, buffers, scalars = bind_cell(op, tdef, genome, step, arch, drawn)
    if {b.name for b in buffers} != present:
        return ()
    tensors = [t for t in op.tensors if t.name in present]
    seq_bufs = tuple(BufferDecl(t.name, t.resolve_dtype(seq).value, t.shape(seq), t.role.value) for t in tensors)
    sliced = []
    for t in tensors:
        if rec.token not in t.dims:
            continue
        i = t.dims.index(rec.token)
        shape = t.shape(seq)
        if math.prod(shape[:i]) != 1:
            raise ValueError(f"op {op.name}: the decode loop's {t.name} {shape} is not token-major (dims before "
                             f"{rec.token} must be 1)")
        sliced.append((t.name, math.prod(shape[i + 1:]) * t.resolve_dtype(seq).nbytes))
    label = f"decode loop of {steps} calls on {seq.label()}{scalar_note(op, drawn)}"
    return (DecodeLoop(label, GateCell(step.label(), tuple(sorted(step.dims_dict().items())), launches, buffers,
                                       scalars),
                       GateCell(seq.label(), tuple(sorted(seq.dims_dict().items())), (), seq_bufs, scalars),
                       steps, tuple(sliced), rec.state_in, rec.state_out, rec.kind),)
