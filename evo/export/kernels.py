"""The kernels of a dispatch table: each distinct build rendered through evo.templates (the factory's
own renderer) and compiled with the factory's NVRTC builder, checked against the cubin the run measured.

The cubin shipped is the one the store holds for the evaluation's build (what was measured). The
rendered source is compiled again: when the compiler is the one that built the stored cubin, the two
must be the same bytes (NVRTC is deterministic), so a template include that changed since the run
(the store keeps template texts, not the `_macros/` they include) cannot ship a source that is not
the measured kernel. A build the store has no cubin for ships the fresh compile.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from evo.build.nvrtc import Builder, BuildInput, prepare
from evo.core.status import Status
from evo.export.errors import ExportError
from evo.export.runs import Entry, RunTable
from evo.templates.template import TemplateDef, TemplateError, parse_template
from memory.store import Store

TRUSTED_ORIGINS = ("file", "disk")  # template files written by people (others get the build-time CUDA check)


@dataclass(frozen=True)
class Kernel:
    """One distinct build of the table: source, cubin and where the cubin came from."""

    id: str
    template: TemplateDef
    params: dict[str, Any]
    dtypes: dict[str, str]
    consts: dict[str, int]
    source: str
    cubin: bytes
    cubin_from: str  # "store" (the measured build) or "compiled" (the store had none)
    compiler: str
    build_key: str
    regs: int
    spill_stores: int


def template_id(t: TemplateDef) -> str:
    return f"{t.name}-{t.source_hash[:12]}"


def templates_of(run: RunTable) -> dict[str, TemplateDef]:
    """The run's templates by source hash, parsed from the texts the store recorded."""
    out = {}
    for h, (text, origin) in run.sources.items():
        try:
            out[h] = parse_template(text, f"source {h[:12]} of run {run.run['run_id']}", trusted=origin in TRUSTED_ORIGINS)
        except TemplateError as e:
            raise ExportError(str(e)) from None
    return out


def _kernel_id(bi: BuildInput) -> str:
    dt = "-".join(f"{k}{v}" for k, v in bi.dtypes)
    cs = "-".join(f"{k}{v}" for k, v in bi.consts)
    return f"{bi.genome.template}-{bi.genome.key()[:10]}-{dt}{'-' + cs if cs else ''}"


def build_kernels(store: Store, run: RunTable, workers: int = 2) -> tuple[list[Kernel], dict[str, str]]:
    """The distinct kernels of the run's table, and the kernel id of every cell."""
    tdefs = templates_of(run)
    per_cell: dict[str, BuildInput] = {}
    for e in run.entries:
        t = tdefs[e.genome.source_hash]
        bi = prepare(t, e.genome, run.arch, e.dtypes, e.dims)
        if bi.render_error:
            raise ExportError(f"cell {e.cell}: {e.genome.short()} does not render: {bi.render_error}")
        per_cell[e.cell] = bi
    unique = list({bi.key(): bi for bi in per_cell.values()}.values())
    with Builder(workers) as builder:
        fresh = {r.build_key: r for r in builder.build(unique)}
    stored = _stored_builds(store, run.entries)
    kernels, ids = {}, {}
    for e in run.entries:
        bi = per_cell[e.cell]
        kid = _kernel_id(bi)
        ids[e.cell] = kid
        if kid not in kernels:
            kernels[kid] = _kernel(kid, tdefs[e.genome.source_hash], bi, fresh[bi.key()], stored.get(e.build_key), e)
    return list(kernels.values()), ids


def _stored_builds(store: Store, entries: Sequence[Entry]) -> dict[str, Any]:
    keys = sorted({e.build_key for e in entries if e.build_key})
    df = store.sql("SELECT build_key, genome_key, status, cubin, compiler, regs, spill_stores FROM builds "
                   "WHERE list_contains(?::VARCHAR[], build_key)", [keys])
    return {r.build_key: r for r in df.itertuples(index=False)}


def _kernel(kid: str, t: TemplateDef, bi: BuildInput, fresh: Any, stored: Any, e: Entry) -> Kernel:
    if fresh.status is not Status.OK:
        raise ExportError(f"cell {e.cell}: {e.genome.short()} no longer builds ({fresh.status.name}: {fresh.error})")
    cubin = bytes(stored.cubin) if stored is not None and stored.cubin is not None else b""
    if stored is not None and stored.genome_key != e.genome.key():
        raise ExportError(f"cell {e.cell}: build {e.build_key[:12]} in the store is of another genome")
    if cubin and stored.compiler == fresh.compiler and cubin != fresh.cubin:
        raise ExportError(
            f"cell {e.cell}: {e.genome.short()} rendered now compiles to another cubin than the one the run measured "
            f"(same compiler {fresh.compiler}): a template include (templates/_macros) changed since the run; "
            "export from a checkout of the factory at the run's commit")
    chosen, origin = (cubin, "store") if cubin else (fresh.cubin, "compiled")
    return Kernel(kid, t, bi.genome.params_dict(), dict(bi.dtypes), dict(bi.consts), bi.source, chosen, origin,
                  stored.compiler if cubin else fresh.compiler, e.build_key or fresh.build_key,
                  _int(stored.regs) if cubin else fresh.regs, _int(stored.spill_stores) if cubin else fresh.spill_stores)


def _int(v: Any) -> int:
    return 0 if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)


def sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()
