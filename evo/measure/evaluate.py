"""Build EvalJobs from (template, genome, build, cell): the launch plan bound to the op's tensors."""

from __future__ import annotations

from typing import Sequence

from evo.build.nvrtc import BuildResult
from evo.core.genome import Genome
from evo.measure.jobs import BufferDecl, EvalJob, GateCell, LaunchJob, Timing
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


def bind_cell(op: OpSpec, tdef: TemplateDef, genome: Genome, cell: Cell,
              arch: int) -> tuple[tuple[LaunchJob, ...], tuple[BufferDecl, ...], tuple[tuple[str, float], ...]]:
    """The genome's launch plan on one cell, bound to the op's tensors (optional ones only when the plan
    uses them on this cell: no buffer for the others, a null pointer for a conditional arg), dims and
    scalars."""
    dims = cell.dims_dict()
    launches, workspaces = tdef.plan(genome.params_dict(), arch, cell.dtypes_dict(), dims)
    scalars = op.scalar_values(cell)
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
) -> EvalJob:
    """One job verifying (and timing, if `timing`) a built genome on one cell, with every input kind
    the op declares, and on `gate_cells` (which must share the build) with the same cubin. `baselines`
    names the peers timed beside it (default: the op's first). Optional tensors the genome's plan does
    not bind are neither allocated, filled nor checked."""
    launches, buffers, scalars = bind_cell(op, tdef, genome, cell, arch)
    present = {b.name for b in buffers}
    gate = []
    for gc in gate_cells:
        gl, gb, gs = bind_cell(op, tdef, genome, gc, arch)
        if {b.name for b in gb} != present:  # the job's left_out and fills are the main cell's
            raise ValueError(f"gate cell {gc.label()} of {cell.label()} binds {sorted(b.name for b in gb)}, "
                             f"the cell {sorted(present)}: not the same variant")
        gate.append(GateCell(gc.label(), tuple(sorted(gc.dims_dict().items())), gl, gb, gs))
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
        baselines=tuple(op.baselines[:1] if baselines is None else baselines),
        left_out=tuple(t.name for t in op.tensors if t.name not in present),
    )
