"""The exported dispatch tables (data/dispatch.json): per op its templates, prebuilt kernels and cells."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from . import expr
from .expr import DATA


@dataclass(frozen=True)
class Launch:
    """One kernel launch with every expression evaluated for one shape; a `side` launch runs on a second stream
    after the main stream's launch of `fork_after`; a `pdl` launch may begin before the main launch before it has
    completed, its kernel waiting for it by griddepcontrol.wait (the factory's plan language,
    evo/templates/template.py)."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: tuple[str, ...]
    stream: str = "main"
    fork_after: str = ""
    pdl: bool = False


@dataclass(frozen=True)
class LaunchDecl:
    """One launch of a template's plan: Jinja expressions over params, dtypes, arch and dims; in the plan only
    where `when` holds (no `when`: always)."""

    kernel: str
    grid: tuple[str, ...]
    block: tuple[str, ...]
    smem: str
    args: tuple[str, ...]
    when: str = ""
    stream: str = "main"
    fork_after: str = ""
    pdl: str = ""  # an expression; empty: never


@dataclass(frozen=True)
class Template:
    """A template as its header declares it: space, constraints, launch plan, specialized dims."""

    id: str
    name: str
    file: str
    specialize: tuple[str, ...]
    space: tuple[tuple[str, tuple[Any, ...]], ...]
    constraints: tuple[tuple[str, str], ...]
    launches: tuple[LaunchDecl, ...]
    workspaces: tuple[tuple[str, str], ...]
    dim_defaults: tuple[tuple[str, int], ...] = ()  # the op's dims a call may lack (a variant's switch off)

    def dims(self, dims: Mapping[str, int]) -> dict[str, int]:
        """A call's dims with the op's defaults for those it lacks (bias and store_rstd: 0, say)."""
        return {**dict(self.dim_defaults), **dims} if self.dim_defaults else dict(dims)

    def consts(self, dims: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
        """The dims this template compiles in, for a call (a dim it lacks at the op's default)."""
        full = self.dims(dims)
        return tuple(sorted((d, int(full[d])) for d in self.specialize))

    def text(self) -> str:
        return (DATA / self.file).read_text()

    def violations(self, params: Mapping[str, Any], arch: int, dtypes: Mapping[str, str],
                   dims: Mapping[str, int]) -> list[str]:
        """Names of the constraints `params` break on this shape (empty: the template admits it)."""
        space = dict(self.space)
        bad = [f"{k}={params.get(k)!r} not in its space" for k in space if params.get(k) not in space[k]]
        if bad:
            return bad
        ctx = expr.context(params, arch, dtypes, self.dims(dims))
        return [name for name, text in self.constraints if not expr.evaluate(text, ctx)]

    def plan(self, params: Mapping[str, Any], arch: int, dtypes: Mapping[str, str],
             dims: Mapping[str, int]) -> tuple[tuple[Launch, ...], dict[str, int]]:
        """The launches and the workspace sizes (bytes) for one shape."""
        ctx = expr.context(params, arch, dtypes, self.dims(dims))

        def dim3(texts: tuple[str, ...]) -> tuple[int, int, int]:
            v = [int(expr.evaluate(t, ctx)) for t in texts] + [1, 1]
            return (v[0], v[1], v[2])

        launches = tuple(Launch(d.kernel, dim3(d.grid), dim3(d.block), int(expr.evaluate(d.smem, ctx)), d.args,
                                d.stream, d.fork_after, bool(d.pdl) and bool(expr.evaluate(d.pdl, ctx)))
                         for d in self.launches if not d.when or expr.evaluate(d.when, ctx))
        return launches, {name: int(expr.evaluate(text, ctx)) for name, text in self.workspaces}

    def render(self, params: Mapping[str, Any], arch: int, dtypes: Mapping[str, str],
               consts: Mapping[str, int]) -> str:
        """CUDA C++ for these params, arch, dtypes and specialized dims."""
        return expr.render(self.text(), expr.context(params, arch, dtypes, consts))


@dataclass(frozen=True)
class Build:
    """A prebuilt kernel: rendered source and cubin for one (genome, dtypes, specialized dims)."""

    id: str
    template: str
    params: tuple[tuple[str, Any], ...]
    dtypes: tuple[tuple[str, str], ...]
    consts: tuple[tuple[str, int], ...]
    cu: str
    cubin: str


@dataclass(frozen=True)
class Entry:
    """One searched cell and the kernel the search picked for it, with what it measured."""

    cell: str
    dtypes: tuple[tuple[str, str], ...]
    dims: tuple[tuple[str, int], ...]
    build: str
    template: str
    params: tuple[tuple[str, Any], ...]
    genome_key: str
    median_us: float
    baseline: str
    baseline_us: float | None


@dataclass(frozen=True)
class Cell:
    """One cell of the op's matrix: its label, dtypes, dims and the matrix that lists it ("" for the op's own,
    else a named matrix such as "residual" or "serving")."""

    label: str
    dtypes: tuple[tuple[str, str], ...]
    dims: tuple[tuple[str, int], ...]
    matrix: str = ""


@dataclass(frozen=True)
class Tensor:
    """An argument of the op: symbolic dims, dtype role (or a fixed dtype) and in/out."""

    name: str
    dims: tuple[str, ...]
    dtype: str
    role: str


@dataclass(frozen=True)
class OpTable:
    """Everything exported for one op (rmsnorm, rmsnorm_bwd) from one run."""

    op: str
    run_id: str
    arch: str  # the arch the cubins were built for, e.g. "sm_90a"
    tensors: tuple[Tensor, ...]
    scalars: tuple[tuple[str, str], ...]  # (name, launch type)
    templates: Mapping[str, Template]
    builds: Mapping[str, Build]
    entries: tuple[Entry, ...]
    dim_defaults: Mapping[str, int] = dataclasses.field(default_factory=dict)  # dims a cell may lack
    run_ids: tuple[str, ...] = ()  # every run of the table (several when runs were merged)
    matrix: tuple["Cell", ...] = ()  # the op's published cells (the benchmark's), searched or not

    @property
    def cells(self) -> tuple["Cell", ...]:
        """The cells a benchmark measures: the op's matrix as exported, else (an older export) the searched ones."""
        return self.matrix or tuple(Cell(e.cell, e.dtypes, e.dims) for e in self.entries)

    def entry(self, cell: "Cell") -> Entry | None:
        """The searched entry of a cell (same dtypes and dims), None where the search had none."""
        return next((e for e in self.entries if e.dtypes == cell.dtypes and e.dims == cell.dims), None)

    @property
    def arch_number(self) -> int:
        return int("".join(ch for ch in self.arch if ch.isdigit()))

    def find_build(self, template: str, params: Mapping[str, Any], dtypes: Mapping[str, str],
                   consts: Mapping[str, int]) -> Build | None:
        key = (template, tuple(sorted(params.items())), tuple(sorted(dtypes.items())), tuple(sorted(consts.items())))
        for b in self.builds.values():
            if (b.template, b.params, b.dtypes, b.consts) == key:
                return b
        return None


def _items(d: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(d.items()))


def _template(tid: str, t: Mapping[str, Any], defaults: Mapping[str, int]) -> Template:
    launches = tuple(LaunchDecl(d["kernel"], tuple(d["grid"]), tuple(d["block"]), d["smem"], tuple(d["args"]),
                                d.get("when", ""), d.get("stream", "main"), d.get("fork_after", ""), d.get("pdl", ""))
                     for d in t["launches"])
    return Template(tid, t["name"], t["file"], tuple(t["specialize"]),
                    tuple((k, tuple(v)) for k, v in t["space"].items()), tuple(t["constraints"].items()),
                    launches, tuple(t["workspaces"].items()), _items(defaults))


def _op_table(op: str, d: Mapping[str, Any]) -> OpTable:
    defaults = {k: int(v) for k, v in d.get("dim_defaults", {}).items()}
    builds = {bid: Build(bid, b["template"], _items(b["params"]), _items(b["dtypes"]), _items(b["consts"]), b["cu"],
                         b["cubin"]) for bid, b in d["builds"].items()}
    entries = tuple(Entry(e["cell"], _items(e["dtypes"]), _items(e["dims"]), e["build"], e["template"],
                          _items(e["params"]), e["genome_key"], e["median_us"], e["baseline"], e["baseline_us"])
                    for e in d["entries"])
    return OpTable(op, d["run_id"], d["arch"], tuple(Tensor(t["name"], tuple(t["dims"]), t["dtype"], t["role"])
                                                   for t in d["tensors"]),
                   tuple((s["name"], s["type"]) for s in d["scalars"]),
                   {tid: _template(tid, t, defaults) for tid, t in d["templates"].items()}, builds, entries,
                   defaults, tuple(d.get("run_ids", [d["run_id"]])),
                   tuple(Cell(c["cell"], _items(c["dtypes"]), _items(c["dims"]), c.get("matrix", ""))
                         for c in d.get("matrix", [])))


@lru_cache(maxsize=1)
def tables() -> dict[str, OpTable]:
    """The exported ops by name: 'rmsnorm', and 'rmsnorm_bwd' when a backward run was exported."""
    doc = json.loads((DATA / "dispatch.json").read_text())
    return {op: _op_table(op, d) for op, d in doc["ops"].items()}


@lru_cache(maxsize=1)
def provenance() -> dict[str, Any]:
    """Where the kernels come from: runs, fingerprints of the measurements, versions (data/provenance.json)."""
    return json.loads((DATA / "provenance.json").read_text())
