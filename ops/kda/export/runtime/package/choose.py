"""Which kernel a KDA call gets, and why, per fla entry point.

Each entry point has its templates: `fused_recurrent_kda` the decode ones (`recurrent*`),
`chunk_kda` the prefill ones (`chunk*`). A call is a cell: its shape dims (B, T, H, HV, K, V, N, Ncu,
SR, SC), the four variant dims (gate, beta_act, qk_l2norm, v_first) and its dtypes (x: q, k, v, beta,
o; g; state: always float32 here, as fla returns an fp32 final state). Templates' constraints read
all of them, so a variant a template does not implement is refused like a shape.

Paths, best first:
- table: the cell was searched; the kernel the search measured there (its prebuilt cubin).
- table-build: a prebuilt cubin of the table fits (same genome, dtypes and specialized dims, e.g. K, V
  and the variant; another B or T only changes the launch plan). The factory's gate ran it on B = 1, 3
  and T = 3 as well.
- rerender: the nearest searched genome (same dtypes first, then nearest dims) whose template admits
  the call, rendered for it and compiled with NVRTC at first use.
- repaired: the nearest genome with the fewest parameters changed so that its template admits the call.
- torch: float32 torch operations (reference.py), correct but not searched: a variant or shape no
  exported template of the entry point admits, CPU tensors, inputs that need grad, or a kernel that
  failed to compile or check.
- missing: `chunk_kda` when the export holds no prefill template at all: the call raises
  MissingKernel naming it, rather than computing prefill some other way.
Every kernel, on every path, is checked against float64 the first time it runs in a shape class (firstuse.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from . import choice, expr
from .choice import KERNEL_PATHS, device_arch
from .firstuse import reduced
from .ladder import nearest_first, refusal, walk
from .table import OpTable, tables

OP = "kda"
PATHS = (*KERNEL_PATHS, "torch", "missing")
# entry point -> (kind of templates it launches, the template name prefix of that kind)
ENTRY_POINTS = {"fused_recurrent_kda": ("decode", "recurrent"), "chunk_kda": ("prefill", "chunk")}
VARIANT_DIMS = ("gate", "beta_act", "qk_l2norm", "v_first")
PROBE_SEQS = 3  # at most this many sequences in a first-use probe (a varlen batch's; an equal-length batch's 2)
STATE_DTYPE = "float32"


class MissingKernel(NotImplementedError):
    """The export holds no kernel of the kind an entry point needs (chunk_kda without a prefill run)."""


@dataclass(frozen=True)
class Choice(choice.Choice):
    """The path one (entry point, cell, arch) takes; `str()` says it in one line."""

    entry: str = "fused_recurrent_kda"

    def head(self) -> str:
        d = dict(self.dims)
        shape = " ".join(f"{k}={d[k]}" for k in ("B", "T", "H", "HV", "K", "V", "N") if k in d)
        var = " ".join(f"{k}={d[k]}" for k in VARIANT_DIMS if d.get(k))
        dts = ",".join(f"{k}={expr.short(v)}" for k, v in self.dtypes if v in expr.DTYPES)
        return f"{self.entry} {dts} {shape}{' ' + var if var else ''}"


def variant_dims(*, use_gate_in_kernel: bool = False, lower_bound: float | None = None,
                 use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
                 use_qk_l2norm_in_kernel: bool = False, state_v_first: bool = False) -> dict[str, int]:
    """fla's keywords as the cell's variant dims (the factory's ops/kda/spec.py): gate 0 log-space g,
    1 softplus gate in the kernel, 2 lower-bound (safe) gate; beta_act 0 none, 1 sigmoid, 2 2*sigmoid."""
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    gate = 0 if not use_gate_in_kernel else (2 if lower_bound is not None else 1)
    beta_act = 0 if not use_beta_sigmoid_in_kernel else (2 if allow_neg_eigval else 1)
    return {"gate": gate, "beta_act": beta_act, "qk_l2norm": int(bool(use_qk_l2norm_in_kernel)),
            "v_first": int(bool(state_v_first))}


def call_dims(q_shape: Sequence[int], v_shape: Sequence[int], n_seqs: int | None,
              variant: Mapping[str, int]) -> dict[str, int]:
    """The cell of a call: q [B, T, H, K], v [B, T, HV, V], N sequences (B, or len(cu_seqlens) - 1)."""
    if len(q_shape) != 4 or len(v_shape) != 4:
        raise ValueError(f"kda: q and v must be 4-d (B, T, H, K) and (B, T, HV, V), got {tuple(q_shape)} and "
                         f"{tuple(v_shape)}")
    b, t, h, k = (int(x) for x in q_shape)
    hv, v = int(v_shape[2]), int(v_shape[3])
    n = b if n_seqs is None else int(n_seqs)
    sr, sc = (v, k) if variant.get("v_first") else (k, v)
    dims = {"B": b, "T": t, "H": h, "HV": hv, "K": k, "V": v, "N": n, "Ncu": n + 1, "SR": sr, "SC": sc}
    return dims | {d: int(variant.get(d, 0)) for d in VARIANT_DIMS}


def probe_dims(c: Choice) -> tuple[tuple[str, int], ...]:
    """The shape standing for a call's shape class in the first-use check (firstuse.py): T by its class
    (firstuse.reduced; a decode batch's B too), an equal-length prefill batch at most 2 sequences, a varlen batch at
    most PROBE_SEQS; heads, K, V and the variant as the call's."""
    d = dict(c.dims)
    t = reduced(d["T"])
    if d["N"] != d["B"]:  # varlen: B = 1, N sequences over T tokens
        n = min(d["N"], PROBE_SEQS, t)
        d |= {"T": t, "N": n, "Ncu": n + 1}
    else:
        b = reduced(d["B"]) if d["T"] == 1 else min(d["B"], 2)
        d |= {"T": t, "B": b, "N": b, "Ncu": b + 1}
    return tuple(sorted(d.items()))


def kind_of(template_name: str) -> str:
    """'decode' or 'prefill': the entry point a template serves, by its name; '' for neither."""
    for kind, prefix in ENTRY_POINTS.values():
        if template_name.startswith(prefix):
            return kind
    return ""


def templates_of(table: OpTable | None, entry: str) -> list[str]:
    """Ids of the exported templates an entry point launches."""
    kind = ENTRY_POINTS[entry][0]
    return [] if table is None else sorted(tid for tid, t in table.templates.items() if kind_of(t.name) == kind)


def _torch(entry: str, dims: Mapping[str, int], dtypes: Mapping[str, str], arch: int, reason: str,
           path: str = "torch") -> Choice:
    return Choice(OP, path, tuple(sorted(dims.items())), tuple(sorted(dtypes.items())), arch, reason, entry=entry)


@lru_cache(maxsize=4096)
def choose(entry: str, dims: tuple[tuple[str, int], ...], dtypes: tuple[tuple[str, str], ...], arch: int) -> Choice:
    """The path of one call of `entry` (a key of ENTRY_POINTS) on a GPU of arch `arch` (e.g. 90)."""
    if entry not in ENTRY_POINTS:
        raise ValueError(f"kda has no entry point {entry!r}; expected one of {sorted(ENTRY_POINTS)}")
    kind, prefix = ENTRY_POINTS[entry]
    want_dims, want_dt = dict(dims), dict(dtypes)
    table: OpTable | None = tables().get(OP)
    mine = templates_of(table, entry)
    if not mine:
        have = sorted({t.name for t in table.templates.values()}) if table else []
        why = (f"no {kind} kernel was exported: {entry} needs a {prefix}* template, the exported run(s) searched "
               f"{', '.join(have) or 'no kda template'}")
        return _torch(entry, want_dims, want_dt, arch, why, "missing" if kind == "prefill" else "torch")
    if any(d not in expr.DTYPES for d in want_dt.values()):
        return _torch(entry, want_dims, want_dt, arch, f"dtypes {want_dt} are not all kernel dtypes")
    variant = {d: want_dims.get(d, 0) for d in VARIANT_DIMS}
    genomes = nearest_first((e for e in table.entries if e.template in mine), want_dims, want_dt,
                            lambda e: {d: dict(e.dims).get(d, 0) for d in VARIANT_DIMS} != variant)
    step = walk(table, genomes, arch, want_dims, want_dt, "call")
    if step is not None:
        return Choice.of_step(OP, step, dims, dtypes, arch, entry=entry)
    return _torch(entry, want_dims, want_dt, arch, refusal(table, genomes[0], arch, want_dims, want_dt, kind))


def explain(q_shape: Sequence[int], v_shape: Sequence[int] | None = None, dtype: Any = "bfloat16", *,
            entry: str = "fused_recurrent_kda", g_dtype: Any = "float32", state_dtype: Any = None,
            n_seqs: int | None = None, use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
            use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
            lower_bound: float | None = None, state_v_first: bool = False, arch: int | None = None) -> Choice:
    """Which path `entry` (fused_recurrent_kda or chunk_kda) takes for CUDA tensors q of `q_shape` and
    v of `v_shape` (default: q's) in `dtype`, g in `g_dtype`, an initial state in `state_dtype` (None: no
    initial state), `n_seqs` sequences (len(cu_seqlens) - 1; None: no cu_seqlens) and fla's keywords;
    arch defaults to the current GPU's, else the export's."""
    variant = variant_dims(use_gate_in_kernel=use_gate_in_kernel, lower_bound=lower_bound,
                           use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                           use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_v_first=state_v_first)
    dims = call_dims(q_shape, v_shape if v_shape is not None else q_shape, n_seqs, variant)
    dt = {"x": expr.dtype_name(dtype), "g": expr.dtype_name(g_dtype), "state": STATE_DTYPE}
    if arch is None:
        arch = device_arch()
    if arch is None:
        t = tables().get(OP)
        arch = t.arch_number if t else 90
    problem = unsupported(dims)
    if problem:
        return _torch(entry, dims, dt, arch, problem)
    c = choose(entry, tuple(sorted(dims.items())), tuple(sorted(dt.items())), arch)
    notes = []
    if state_dtype is not None and expr.dtype_name(state_dtype) != STATE_DTYPE and c.kernel:
        notes.append(f"initial_state {expr.dtype_name(state_dtype)} read as float32 (fla returns an fp32 final state)")
    return c.with_notes(notes)


def unsupported(dims: Mapping[str, int]) -> str:
    """Why no kernel can take a call of these dims whatever the table holds ('' when one may)."""
    if dims["N"] != dims["B"] and dims["B"] != 1:
        return f"cu_seqlens needs B = 1 (sequences packed along T), got B = {dims['B']}"
    if dims["H"] < 1 or dims["HV"] % dims["H"]:
        return f"HV = {dims['HV']} value heads is not a multiple of H = {dims['H']}"
    if min(dims["B"], dims["T"], dims["K"], dims["V"], dims["HV"]) == 0:
        return "an empty tensor"
    return ""
