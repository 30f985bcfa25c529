"""A run's context and its build stage: the typed Session, the cells, and genomes -> builds (+ their rows).

Stages return records and the rows the store should get; they never write the store themselves: the
loop's one writer records a whole generation in one transaction (evo/loop/record.py).
"""

from __future__ import annotations

import itertools
import json
import random
import re
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from evo.build.nvrtc import Builder, BuildInput, BuildResult, prepare, resources_of
from evo.core.config import Config, ConfigError
from evo.core.genome import Genome
from evo.core.status import Status
from evo.loop.build_summary import BuildSummary
from evo.templates.template import TemplateDef, TemplateError, load_templates
from memory.builds import reusable_builds
from memory.queries import first_built
from memory.rows import BuildRow, CandidateRow, Row, RunRow, SourceRow
from memory.runs import stored_config
from memory.store import Store
from evo.core.registry import get_op
from evo.core.spec import Cell, DType, OpSpec


class NoGpuError(RuntimeError):
    """Evaluation was asked for on a machine without an NVIDIA GPU."""


def stored_builds(store: Store, keys: Sequence[str]) -> list[BuildResult]:
    """Build results the store holds for these keys (cubin, ptxas resources, or the failure), as BuildResults."""
    if not keys:
        return []
    df = reusable_builds(store, keys)
    out = []
    for r in df.itertuples(index=False):
        log = r.log if isinstance(r.log, str) else ""
        cubin = bytes(r.cubin) if isinstance(r.cubin, (bytes, bytearray, memoryview)) else b""
        if r.status == Status.OK.value and not cubin:
            continue  # nothing to launch
        resources = tuple(sorted(resources_of(log, cubin).items()))
        out.append(BuildResult(r.build_key, Status(r.status), resources, cubin, log,
                               r.error if isinstance(r.error, str) else "",
                               float(r.compile_ms) if r.compile_ms == r.compile_ms else 0.0,
                               r.compiler if isinstance(r.compiler, str) else ""))
    return out


def arch_number(arch: str) -> int:
    return int("".join(ch for ch in arch if ch.isdigit()))


def cells_for(config: Config, op: OpSpec) -> list[Cell]:
    """The cells an experiment optimizes: the matrix or product the config names, less the cells whose label
    `cells.only` does not find (an error when it leaves none)."""
    cells = _configured_cells(config, op)
    if not config.cells.only:
        return cells
    pick = re.compile(config.cells.only)
    kept = [c for c in cells if pick.search(c.label())]
    if not kept:
        raise ConfigError(f"cells.only: {config.cells.only!r} matches none of the {len(cells)} cells "
                          f"(labels look like {cells[0].label()!r})" if cells else "cells.only: there are no cells")
    return kept


def _configured_cells(config: Config, op: OpSpec) -> list[Cell]:
    if config.cells.matrix:  # the op's (or a named) matrix, optionally only the cells of the given dtypes
        name = config.cells.matrix
        if isinstance(name, str) and name not in op.matrices:
            raise ConfigError(f"cells.matrix: op {op.name} has no matrix named {name!r} "
                              f"(has: {', '.join(sorted(op.matrices)) or 'none besides its default'})")
        cells = op.matrices[name]() if isinstance(name, str) else op.matrix()
        want = {DType.parse(d) for d in config.cells.dtypes}
        return [c for c in cells if not want or c.dtype(op.dtype_roles[0]) in want]
    roles = op.dtype_roles
    dims = config.cells.dims
    names = sorted(dims)
    return [
        Cell.make({r: d for r in roles}, dict(zip(names, combo)))
        for d in config.cells.dtypes
        for combo in itertools.product(*(dims[n] for n in names))
    ]


def dtype_sets(cells: Sequence[Cell]) -> list[dict[str, str]]:
    return [dict(t) for t in dict.fromkeys(tuple(sorted(c.dtypes_dict().items())) for c in cells)]


@dataclass(frozen=True)
class Session:
    """A run's context: config, store, run id, and what follows from the config (op, templates, cells, arch).

    Frozen; `templates` is the one part that grows during a run (the LLM stage adds what it writes)."""

    config: Config
    store: Store
    run_id: str
    log: Callable[[str], None] = print
    op: OpSpec = field(init=False)
    templates: dict[str, TemplateDef] = field(init=False)
    cells: tuple[Cell, ...] = field(init=False)
    arch: int = field(init=False)

    def __post_init__(self) -> None:
        op = get_op(self.config.run.op)
        # a broken template file stops only the runs that use it: the others say so in one line and go on
        all_t = load_templates(op.name, use=self.config.run.templates or None,
                               warn=lambda why: self.log(f"warning: skipped a broken template: {why}"))
        wanted = self.config.run.templates or tuple(all_t)
        missing = [t for t in wanted if t not in all_t]
        if missing:
            raise TemplateError(f"run.templates: no template(s) {missing} for op {op.name} (have {sorted(all_t)})")
        extra = sorted(set(self.config.search.space) - set(wanted))
        if extra:
            raise TemplateError(f"search.space: no template(s) {extra} in this run (have {sorted(wanted)})")
        space = self.config.search.space
        derived = {"op": op, "templates": {k: all_t[k].restrict(space[k]) if k in space else all_t[k] for k in wanted},
                   "cells": tuple(cells_for(self.config, op)), "arch": arch_number(self.config.run.arch)}
        for k, v in derived.items():
            object.__setattr__(self, k, v)  # frozen: set once, here

    def record_run(self) -> bool:
        """Record a new run, or mark an existing one running again; False when it existed (a resume).

        A run id is bound to its config: continuing it under a config with another hash is refused."""
        known = stored_config(self.store, self.run_id)
        c = self.config
        if known is None:
            self.store.write([RunRow(run_id=self.run_id, op=c.run.op, arch=c.run.arch, config_toml=c.source_text,
                                     config_hash=c.config_hash, seed=c.run.seed, status="running",
                                     config_path=c.path or None)])
            return True
        if known.hash != c.config_hash:
            was = known.path or "another config"
            raise ConfigError(
                f"run {self.run_id} was started with {was} (config hash {known.hash}), not this one "
                f"(hash {c.config_hash}); start a new run with `kfactory run {c.path or 'CONFIG'}` (no --run-id, "
                f"or a new one), or continue this one with `kfactory resume {self.run_id}`")
        self.store.finish_run(self.run_id, "running", None)
        return False

    def build_inputs(self, genome: Genome) -> list[tuple[Cell, BuildInput]]:
        """One BuildInput per cell where the genome is legal (cells sharing a build share the input)."""
        tdef = self.templates[genome.template]
        out = []
        for cell in self.cells:
            if tdef.is_valid(genome.params_dict(), self.arch, cell.dtypes_dict(), cell.dims_dict()):
                out.append((cell, prepare(tdef, genome, self.config.run.arch, cell.dtypes_dict(), cell.dims_dict())))
        return out


@dataclass(frozen=True)
class Built:
    """The build stage's result: per genome key its (cell, build) pairs, the rows to record, and counts."""

    cells: dict[str, list[tuple[Cell, BuildResult]]]
    rows: list[Row]  # sources (templates/ files), candidates, every distinct build
    compiled: int  # build inputs handed to the compiler
    reused: int  # build inputs answered from the store's builds
    distinct: tuple[tuple[str, BuildResult], ...] = ()  # (template, result) of every distinct build, in order


def spill_limited(r: BuildResult, limit: int) -> BuildResult:
    """r, or r as a RESOURCE_ERROR where its kernels spill more than `limit` bytes (-1: no limit); the run's view
    of the build only: the store keeps it as compiled, so a run without the limit times it."""
    spill = max(r.spill_stores, r.spill_loads)
    if limit < 0 or r.status is not Status.OK or spill <= limit:
        return r
    return replace(r, status=Status.RESOURCE_ERROR,
                   error=f"spills {r.spill_stores} B stored, {r.spill_loads} B loaded > build.max_spill_bytes {limit}")


def build(session: Session, builder: Builder, genomes: Sequence[Genome], generation: int,
          origins: Mapping[str, str] | None = None, parents: Mapping[str, str] | None = None) -> Built:
    """Build every genome for its legal cells; the rows record sources, candidates and every build."""
    per_genome = {g.key(): session.build_inputs(g) for g in genomes}
    flat = [bi for pairs in per_genome.values() for _, bi in pairs]
    unique = list({bi.key(): bi for bi in flat}.values())
    # Same build key, same cubin: what an earlier run (or this one, before a resume) built is not rebuilt.
    wanted = [bi.key() for bi in unique if not bi.render_error and not builder.has(bi.key())]
    stored = stored_builds(session.store, wanted)
    builder.remember(stored)
    before = builder.compiled
    results = {r.build_key: r for r in builder.build(unique)}
    rows: list[Row] = []
    for g in genomes:
        tdef = session.templates[g.template]
        if tdef.trusted:  # templates/ files; LLM-written sources are recorded with their parent and call
            rows.append(SourceRow.of(tdef.text, op=session.op.name, template=tdef.name, origin="file"))
        parent = (parents or {}).get(g.key())
        rows.append(CandidateRow(genome_key=g.key(), op=g.op, template=g.template, source_hash=g.source_hash,
                                 params_json=g.params_json(), origin=(origins or {}).get(g.key(), "init"),
                                 parents_json=json.dumps([parent] if parent else []), run_id=session.run_id,
                                 generation=generation))
    for bi in unique:
        r = results[bi.key()]
        rows.append(BuildRow(build_key=r.build_key, genome_key=bi.genome.key(), run_id=session.run_id, arch=bi.arch,
                             dtypes_json=json.dumps(dict(bi.dtypes), sort_keys=True),
                             consts_json=json.dumps(dict(bi.consts), sort_keys=True), status=r.status.value,
                             regs=r.regs, spill_stores=r.spill_stores, spill_loads=r.spill_loads,
                             smem_bytes=r.smem_bytes, stack_bytes=r.stack_bytes, compile_ms=r.compile_ms,
                             compiler=r.compiler, log=r.log, error=r.error or None, cubin=r.cubin or None))
    limit = session.config.build.max_spill_bytes
    cells = {k: [(c, spill_limited(results[bi.key()], limit)) for c, bi in pairs] for k, pairs in per_genome.items()}
    return Built(cells, rows, builder.compiled - before, len(stored),
                 tuple((bi.genome.template, results[bi.key()]) for bi in unique))


def new_run_id(config: Config) -> str:
    name = config.run.name or config.run.op
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def initial_population(session: Session, rng: random.Random) -> list[Genome]:
    """Each template's default point first, then legal random points, deduplicated by key."""
    from evo.search.space import sample

    n = session.config.search.population
    dsets = dtype_sets(session.cells)
    dims = [c.dims_dict() for c in session.cells]
    out: dict[str, Genome] = {}
    for tdef in session.templates.values():
        g = Genome.make(tdef.op, tdef.name, tdef.source_hash, tdef.default_params())
        out[g.key()] = g
    names = sorted(session.templates)
    tries = 0
    while len(out) < n and tries < 50 * n:
        tdef = session.templates[names[tries % len(names)]]
        tries += 1
        p = sample(tdef, rng, session.arch, dsets, dims)
        if p is not None:
            g = Genome.make(tdef.op, tdef.name, tdef.source_hash, p)
            out.setdefault(g.key(), g)
    return list(out.values())[:max(n, len(session.templates))]


def run_build_stage(session: Session) -> BuildSummary:
    """Render and compile the initial population; every build lands in the store, and its summary on the console."""
    rng = random.Random(session.config.run.seed)
    pop = initial_population(session, rng)
    with Builder(session.config.build.workers, timeout_s=session.config.build.timeout_s) as builder:
        result = build(session, builder, pop, generation=0)
    session.store.write(result.rows)
    built = result.cells
    n_ok = sum(r.status is Status.OK for pairs in built.values() for _, r in pairs)
    n_all = len({r.build_key for pairs in built.values() for _, r in pairs})
    session.log(f"built {len(pop)} genomes -> {n_all} distinct builds for {session.config.run.arch}, "
                f"{n_ok} cell bindings OK")
    summary = BuildSummary().add(result.distinct)
    summary = replace(summary, first_built=first_built(session.store, session.run_id, list(summary.builds)))
    for line in summary.lines():
        session.log(line)
    return summary
