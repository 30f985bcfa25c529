"""The package's benchmark: its KDA calls (`chunk_kda` on prefill and varlen cells, `fused_recurrent_kda` on decode
cells) against every peer on every cell of the op's matrix, in one process, on the same inputs (sides.compare:
every side checked against float64 first, then timed in turn sample by sample, the L2 flushed before each sample;
kernel time with the host hidden, call time as a Python caller waits).

Peers (peers.py): fla's chunk_kda by its default path and by its bounded-gate tensor-core path (safe_gate=True; the
gates are drawn inside its bound for every side), fla's FlashKDA backend, fla's fused_recurrent_kda on decode cells,
cuDNN frontend's KDA and cuLA; each present or absent with the reason. Every row names whether the cell was searched,
and its floor (floor.py): the package's kernel time against the longer of its bytes at the copy ceiling and its
arithmetic at the card's dense bf16 rate. Long sequences of few heads are also timed split into spans run at once
(split.py), as a diagnostic side "package.split<spans>" that is no peer.

    python -m <package>.bench [--out bench.json] [--tables prefill,decode] [--cells REGEX] [--peers ...]
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import torch

from . import api, benchmark, floor, peers, split, verify
from .choose import explain
from .sides import PACKAGE_SIDE, compare
from .table import Cell, tables

_TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def inputs(dims: dict[str, int], dtypes: dict[str, str], seed: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tensors and fla keywords for a cell: unit q, k rows (or rows of norm 0.1..10 under the in-kernel
    norm), log decays exp(-exp(N(-2, 1))), an initial state ~K^-1/2, cu_seqlens of uneven lengths when
    N != B, A_log and dt_bias for a gate computed in the kernel."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b, t, h, hv, k, v, n = (dims[d] for d in ("B", "T", "H", "HV", "K", "V", "N"))
    x, gdt = _TORCH[dtypes["x"]], _TORCH[dtypes["g"]]

    def rows(shape: tuple[int, ...]) -> torch.Tensor:
        r = torch.nn.functional.normalize(torch.randn(shape, device="cuda", generator=gen), dim=-1)
        if dims["qk_l2norm"]:
            r = r * 10.0 ** (2 * torch.rand((*shape[:-1], 1), device="cuda", generator=gen) - 1)
        return r.to(x)

    q, kk = rows((b, t, h, k)), rows((b, t, h, k))
    vv = torch.randn(b, t, hv, v, device="cuda", generator=gen).to(x)
    # log decays inside the safe gate's bound [-5, 0), so fla's bounded-gate path is a valid call on every cell
    decay = -torch.exp(torch.randn(b, t, hv, k, device="cuda", generator=gen) - 2.0).clamp(max=4.99)
    logits = torch.randn(b, t, hv, device="cuda", generator=gen)
    beta = (logits if dims["beta_act"] else torch.sigmoid(logits)).to(x)
    shape = (n, hv, dims["SR"], dims["SC"])
    h0 = torch.randn(shape, device="cuda", generator=gen) / math.sqrt(k)
    kw: dict[str, Any] = {"initial_state": h0, "output_final_state": True,
                          "use_qk_l2norm_in_kernel": bool(dims["qk_l2norm"]),
                          "use_beta_sigmoid_in_kernel": dims["beta_act"] != 0,
                          "allow_neg_eigval": dims["beta_act"] == 2, "state_v_first": bool(dims["v_first"])}
    g = decay
    if dims["gate"]:
        kw |= {"use_gate_in_kernel": True, "A_log": torch.zeros(hv, device="cuda"),
               "dt_bias": torch.zeros(hv * k, device="cuda")}
        if dims["gate"] == 2:
            kw["lower_bound"] = -5.0
            g = torch.logit((decay / -5.0).clamp(1e-6, 1 - 1e-4))
        else:
            g = torch.log(torch.expm1(-decay))  # softplus^-1 of -decay, with A_log = 0
    if n != b:
        cuts = torch.randperm(t - 1, generator=torch.Generator().manual_seed(seed))[: n - 1] + 1
        kw["cu_seqlens"] = torch.cat([torch.tensor([0]), cuts.sort().values, torch.tensor([t])]).to("cuda")
    return {"q": q, "k": kk, "v": vv, "g": g.to(gdt), "beta": beta}, kw


def check(dims: dict[str, int], t: dict[str, Any], kw: dict[str, Any], o: torch.Tensor, final: torch.Tensor) -> str:
    s = {"scale": dims["K"] ** -0.5, "lower_bound": kw.get("lower_bound") or -5.0,
         **{d: dims[d] for d in ("gate", "beta_act", "qk_l2norm", "v_first")}}
    bound = {**t, **{n: kw.get(n) for n in ("initial_state", "cu_seqlens", "A_log", "dt_bias")}}
    return verify.check(bound, s, o, final)


TABLES = ("prefill", "varlen", "decode")


def table_of(dims: dict[str, int]) -> str:
    return "decode" if dims["T"] == 1 else "varlen" if dims["N"] != dims["B"] else "prefill"


def nbytes(t: dict[str, Any], kw: dict[str, Any]) -> int:
    """Every input read once and o and the final state written once."""
    ins = [*t.values(), kw["initial_state"]]
    return sum(x.numel() * x.element_size() for x in ins) + t["v"].numel() * t["v"].element_size() + \
        kw["initial_state"].numel() * 4


def path(entry: str, t: dict[str, Any], kw: dict[str, Any]) -> str:
    """The path the package's call takes on these inputs (explain())."""
    cu = kw.get("cu_seqlens")
    flags = ("use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval",
             "lower_bound", "state_v_first")
    return explain(tuple(t["q"].shape), tuple(t["v"].shape), t["q"].dtype, entry=entry, g_dtype=t["g"].dtype,
                   state_dtype=kw["initial_state"].dtype, n_seqs=None if cu is None else len(cu) - 1,
                   **{f: kw[f] for f in flags if f in kw}).path


def row(c: Cell, names: tuple[str, ...], samples: int, ceiling: float | None) -> dict[str, Any]:
    dims, dt = dict(c.dims), dict(c.dtypes)
    entry = "fused_recurrent_kda" if dims["T"] == 1 else "chunk_kda"
    t, kw = inputs(dims, dt)
    ours = getattr(api, entry)
    sides = {PACKAGE_SIDE: lambda: ours(**t, **kw), **peers.sides(dims, t, kw, names)}
    spans = split.split_spans(dims)
    if entry == "chunk_kda" and spans:  # a diagnostic side, no peer: the package's chunk_kda on spans run at once
        sides[f"{PACKAGE_SIDE}.split{spans}"] = lambda: split.split_kda(api.chunk_kda, **t, spans=spans, **kw)

    def checked(name: str, result: Any) -> str:
        o, final = peers.outputs(name, result, t["v"], bool(dims["v_first"]))
        return check(dims, t, kw, o, final)

    e = tables()["kda"].entry(c)
    moved = nbytes(t, kw)
    out = {"table": table_of(dims), "cell": c.label, "entry": entry, "dims": dims, "dtypes": dt,
           "path": path(entry, t, kw),
           "searched": e is not None, "searched_median_us": e.median_us if e else None,
           **compare(sides, checked, moved, samples, ceiling)}
    mine = out["sides"].get(PACKAGE_SIDE, {})
    out["floor"] = floor.floor(moved, floor.flops(dims), ceiling, floor.dense_bf16_tflops(torch.cuda.get_device_name()),
                               mine.get("kernel_us") if out["correct"] else None)
    torch.cuda.empty_cache()
    return out


def table_cells(table: str) -> list[Cell]:
    return [c for c in (tables()["kda"].cells if "kda" in tables() else ()) if table_of(dict(c.dims)) == table]


def measure(args: argparse.Namespace) -> benchmark.Measured:
    return benchmark.measure_tables(args, table_cells, lambda _, c, names, n, ceiling: row(c, names, n, ceiling))


def main(argv: list[str] | None = None) -> int:
    return benchmark.main(argv, __doc__.split("\n\n")[0], "the first cell of each table", measure, peers.DISTS,
                          TABLES, peers.NAMES)


if __name__ == "__main__":
    sys.exit(main())
