"""Build EvalJobs from (template, genome, build, cell): the launch plan bound to the op's tensors."""

from __future__ import annotations

from typing import Sequence

from evo.build.nvrtc import BuildResult
from evo.core.genome import Genome
from evo.measure.jobs import BufferDecl, EvalJob, GateCell, LaunchJob, Timing
from evo.templates.template import Launch, TemplateDef
from ops.spec import Cell, OpSpec, TensorSpec


def bound_tensors(op: OpSpec, launches: Sequence[Launch]) -> tuple[TensorSpec, ...]:
    """The op's tensors a launch plan uses: every required one, and an optional one only when a launch
    binds it (a template that leaves it out is the op's variant without it)."""
    named = {a.partition(":")[0] for ln in launches for a in ln.args}
    return tuple(t for t in op.tensors if not t.optional or t.name in named)


def bind_cell(op: OpSpec, tdef: TemplateDef, genome: Genome, cell: Cell,
              arch: int) -> tuple[tuple[LaunchJob, ...], tuple[BufferDecl, ...], tuple[tuple[str, float], ...]]:
    """The genome's launch plan on one cell, bound to the op's tensors (optional ones only when the plan
    uses them: no buffer for the others), dims and scalars."""
    dims = cell.dims_dict()
    launches, workspaces = tdef.plan(genome.params_dict(), arch, cell.dtypes_dict(), dims)
    scalars = op.scalar_values(cell)
    buffers = [BufferDecl(t.name, t.resolve_dtype(cell).value, t.shape(cell), t.role.value)
               for t in bound_tensors(op, launches)]
    buffers += [BufferDecl(name, "uint8", (nbytes,), "ws") for name, nbytes in workspaces.items()]
    names = {b.name for b in buffers}
    scalar_kinds = {s.name: ("f32" if s.kind is float else "i32") for s in op.scalars}
    jobs = []
    for ln in launches:
        args = []
        for a in ln.args:
            name, _, typ = a.partition(":")
            if name in names:
                args.append(("buf", name))
            elif name in dims:
                args.append((typ or "i32", dims[name]))
            elif name in scalars:
                args.append((typ or scalar_kinds[name], scalars[name]))
            else:
                raise KeyError(f"template {tdef.name}: launch arg {name!r} is not a tensor, dim or scalar of {op.name}")
        jobs.append(LaunchJob(ln.kernel, ln.grid, ln.block, ln.smem, tuple(args)))
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
