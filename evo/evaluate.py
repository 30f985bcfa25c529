"""Build EvalJobs from (template, genome, build, cell): the launch plan bound to the op's tensors."""

from __future__ import annotations

from evo.build import BuildResult
from evo.genome import Genome
from evo.jobs import BufferDecl, EvalJob, LaunchJob, Timing
from evo.template import TemplateDef
from ops.spec import Cell, OpSpec


def make_job(
    op: OpSpec,
    tdef: TemplateDef,
    genome: Genome,
    build: BuildResult,
    cell: Cell,
    arch: int,
    seed: int,
    kinds: tuple[str, ...],
    timing: Timing | None,
    baseline: bool = True,
    job_id: str = "",
) -> EvalJob:
    """One job verifying (and timing, if `timing`) a built genome on one cell."""
    dims = cell.dims_dict()
    dtypes = cell.dtypes_dict()
    launches, workspaces = tdef.plan(genome.params_dict(), arch, dtypes, dims)
    scalars = op.scalar_values(cell)
    buffers = [BufferDecl(t.name, t.resolve_dtype(cell).value, t.shape(cell), t.role.value) for t in op.tensors]
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
    tols = tuple(
        (t.name, (tol.atol, tol.rtol, tol.rel_norm))
        for t in op.outputs()
        for tol in [op.tolerance(cell, t.name)]
    )
    return EvalJob(
        job_id=job_id or f"{genome.key()[:12]}:{cell.label()}",
        op=op.name,
        dims=tuple(sorted(dims.items())),
        dtypes=tuple(sorted(dtypes.items())),
        cubin=build.cubin,
        launches=tuple(jobs),
        buffers=tuple(buffers),
        scalars=tuple(sorted(scalars.items())),
        kinds=kinds,
        tolerances=tols,
        seed=seed,
        timing=timing,
        baseline=baseline,
    )
