"""The kernels of a dispatch table: each distinct build rendered through evo.templates (the factory's
own renderer) and compiled with the factory's NVRTC builder, checked against the cubin the run measured.

The cubin shipped is the one the store holds for the evaluation's build (what was measured). The
source, rendered from the template text the store recorded for the run (not today's file) and today's
`_macros/` (the store keeps no includes), is compiled again with the NVRTC that built the stored cubin
(this process's, or another one given by folder, see evo.build.nvrtc_lib) and must give the same
bytes (NVRTC is deterministic): a template include changed since the run cannot ship a source that is
not the measured kernel, and without that run's NVRTC nothing is shipped unchecked. A build the store
has no cubin for ships the fresh compile.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evo.build.nvrtc import Builder, BuildInput, BuildResult, compiler_version, prepare
from evo.core.status import Status
from evo.export.errors import ExportError
from evo.export.runs import Entry, RunTable
from evo.templates.template import TemplateDef, TemplateError, parse_template
from memory.builds import builds_of
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
    cubin_from: str  # "store" (the measured build, rebuilt to the same bytes) or "compiled" (the store had none)
    compiler: str
    build_key: str
    regs: int
    spill_stores: int
    rebuilt_with: str  # the NVRTC that compiled the rendered source again (to the shipped bytes, for "store")


def template_id(t: TemplateDef) -> str:
    return f"{t.name}-{t.source_hash[:12]}"


def templates_of(run: RunTable) -> dict[str, TemplateDef]:
    """The run's templates by source hash, parsed from the texts the store recorded (today's template
    files may have changed since the run; only `_macros/` are read from today's tree)."""
    out = {}
    for h, (text, origin) in run.sources.items():
        try:
            out[h] = parse_template(text, f"source {h[:12]} of run {run.run['run_id']}", trusted=origin in TRUSTED_ORIGINS)
        except TemplateError as e:
            raise ExportError(str(e)) from None
        if out[h].source_hash != h:
            raise ExportError(f"run {run.run['run_id']}: the store's text of source {h[:12]} hashes to "
                              f"{out[h].source_hash[:12]}; the store is inconsistent")
    return out


def _kernel_id(bi: BuildInput) -> str:
    dt = "-".join(f"{k}{v}" for k, v in bi.dtypes)
    cs = "-".join(f"{k}{v}" for k, v in bi.consts)
    return f"{bi.genome.template}-{bi.genome.key()[:10]}-{dt}{'-' + cs if cs else ''}"


def build_kernels(store: Store, run: RunTable, workers: int = 2,
                  nvrtc: Mapping[str, str] | None = None) -> tuple[list[Kernel], dict[str, str]]:
    """The distinct kernels of the run's table, and the kernel id of every cell. `nvrtc`: folders of
    other NVRTCs by version ('nvrtc-13.0'), for cubins this process's NVRTC did not build."""
    tdefs = templates_of(run)
    per_cell: dict[str, BuildInput] = {}
    for e in run.entries:
        t = tdefs[e.genome.source_hash]
        bi = prepare(t, e.genome, run.arch, e.dtypes, e.dims)
        if bi.render_error:
            raise ExportError(f"cell {e.cell}: {e.genome.short()} does not render: {bi.render_error}")
        per_cell[e.cell] = bi
    stored = _stored_builds(store, run.entries)
    fresh = _rebuild(run, per_cell, {e.cell: stored.get(e.build_key) for e in run.entries}, workers, nvrtc or {})
    kernels, ids = {}, {}
    for e in run.entries:
        bi = per_cell[e.cell]
        kid = _kernel_id(bi)
        ids[e.cell] = kid
        if kid not in kernels:
            kernels[kid] = _kernel(kid, tdefs[e.genome.source_hash], bi, fresh[e.cell], stored.get(e.build_key), e)
    return list(kernels.values()), ids


def _has_cubin(stored: Any) -> bool:
    return stored is not None and stored.cubin is not None


def _rebuild(run: RunTable, per_cell: Mapping[str, BuildInput], stored: Mapping[str, Any], workers: int,
             nvrtc: Mapping[str, str]) -> dict[str, BuildResult]:
    """Each cell's build compiled again by the NVRTC that built its stored cubin (else this process's)."""
    here = compiler_version()
    by_compiler: dict[str, dict[str, BuildInput]] = {}
    for cell, bi in per_cell.items():
        s = stored[cell]
        version = s.compiler if _has_cubin(s) and isinstance(s.compiler, str) and s.compiler else here
        by_compiler.setdefault(version, {})[cell] = bi
    missing = sorted(v for v in by_compiler if v != here and v not in nvrtc)
    if missing:
        v = missing[0]
        raise ExportError(
            f"run {run.run['run_id']}: its cubins were built by {v}, this process's NVRTC is {here}; another NVRTC "
            "gives other bytes, so the sources cannot be checked against the measured cubins: pass --nvrtc DIR, a "
            f"folder with {v} (pip install --no-deps --target DIR 'nvidia-cuda-nvrtc=={v.removeprefix('nvrtc-')}.*')")
    out: dict[str, BuildResult] = {}
    for version, cells in sorted(by_compiler.items()):
        unique = list({bi.key(): bi for bi in cells.values()}.values())
        with Builder(workers, nvrtc=None if version == here else nvrtc[version]) as builder:
            results = dict(zip((bi.key() for bi in unique), builder.build(unique)))
        out.update({cell: results[bi.key()] for cell, bi in cells.items()})
    return out


def _stored_builds(store: Store, entries: Sequence[Entry]) -> dict[str, Any]:
    keys = sorted({e.build_key for e in entries if e.build_key})
    df = builds_of(store, keys)
    return {r.build_key: r for r in df.itertuples(index=False)}


def _kernel(kid: str, t: TemplateDef, bi: BuildInput, fresh: BuildResult, stored: Any, e: Entry) -> Kernel:
    if fresh.status is not Status.OK:
        raise ExportError(f"cell {e.cell}: {e.genome.short()} no longer builds ({fresh.status.name}: {fresh.error})")
    cubin = bytes(stored.cubin) if _has_cubin(stored) else b""
    if stored is not None and stored.genome_key != e.genome.key():
        raise ExportError(f"cell {e.cell}: build {e.build_key[:12]} in the store is of another genome")
    if cubin and isinstance(stored.compiler, str) and stored.compiler != fresh.compiler:
        raise ExportError(f"cell {e.cell}: the stored cubin was built by {stored.compiler}, the rebuild ran "
                          f"{fresh.compiler}: give --nvrtc a folder with {stored.compiler}")
    if cubin and cubin != fresh.cubin:
        raise ExportError(
            f"cell {e.cell}: {e.genome.short()} rendered now compiles to another cubin than the one the run measured "
            f"(same compiler {fresh.compiler}): a template include (templates/_macros) changed since the run; "
            "export from a checkout of the factory at the run's commit")
    chosen, origin = (cubin, "store") if cubin else (fresh.cubin, "compiled")
    regs, spills = (_int(stored.regs), _int(stored.spill_stores)) if cubin else (fresh.regs, fresh.spill_stores)
    return Kernel(kid, t, bi.genome.params_dict(), dict(bi.dtypes), dict(bi.consts), bi.source, chosen, origin,
                  stored.compiler if cubin else fresh.compiler, e.build_key or fresh.build_key, regs, spills,
                  fresh.compiler)


def _int(v: Any) -> int:
    return 0 if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)


def sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()
