"""The package on a CUDA GPU: every searched cell, off-table batches, T and head dims, the variants the
kernels compile in, and those that take the torch path, against a float64 reference within the
factory's tolerances (o by the x dtype, the final state by the coarser of x and fp32); fla's return
convention; the path each call took (stats) is the one explain() names."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import kf_pkg as kf
from kf_pkg import bench, verify
from kf_pkg.choose import ENTRY_POINTS, call_dims, kind_of, variant_dims

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="SKIPPED: needs a CUDA GPU (none visible)")

TABLE = kf.tables()["kda"]
DECODE = [e for e in TABLE.entries if kind_of(TABLE.templates[e.template].name) == "decode"]
# The cell the calls below start from: the first decode cell, or in a package without one the first prefill cell
# at T = 64 (its entry point, chunk_kda, then takes the calls)
BASE = DECODE[0] if DECODE else next(iter(TABLE.entries))
BASE_ENTRY = next(ep for ep, (k, _) in ENTRY_POINTS.items() if k == kind_of(TABLE.templates[BASE.template].name))
_TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _run(entry: str, dims: dict, dtypes: dict, seed: int = 0) -> tuple[str, str]:
    """One call on bench's inputs for a cell: (the problem vs float64 or '', the path stats counted)."""
    t, kw = bench.inputs(dims, dtypes, seed)
    before = dict(kf.stats().get(entry, {}))
    o, final = getattr(kf, entry)(**t, **kw)
    after = kf.stats()[entry]
    path = next(p for p, n in after.items() if n != before.get(p, 0))
    assert o.shape == t["v"].shape and o.dtype == t["v"].dtype
    assert final.dtype == torch.float32 and final.shape == (dims["N"], dims["HV"], dims["SR"], dims["SC"])
    return bench.check(dims, t, kw, o, final), path


def _explained(entry: str, dims: dict, dtypes: dict) -> str:
    return kf.explain((dims["B"], dims["T"], dims["H"], dims["K"]), (dims["B"], dims["T"], dims["HV"], dims["V"]),
                      dtypes["x"], entry=entry, g_dtype=dtypes["g"], n_seqs=dims["N"] if dims["N"] != dims["B"] else None,
                      use_qk_l2norm_in_kernel=bool(dims["qk_l2norm"]), use_gate_in_kernel=dims["gate"] != 0,
                      use_beta_sigmoid_in_kernel=dims["beta_act"] != 0, allow_neg_eigval=dims["beta_act"] == 2,
                      lower_bound=-5.0 if dims["gate"] == 2 else None, state_v_first=bool(dims["v_first"])).path


@pytest.mark.parametrize("e", DECODE, ids=lambda e: e.cell)
def test_searched_decode_cells(e):
    dims, dt = dict(e.dims), dict(e.dtypes)
    problem, path = _run("fused_recurrent_kda", dims, dt)
    assert not problem and path == "table", (problem, path)


@pytest.mark.skipif(not DECODE, reason="no decode cell exported")
def test_a_decode_call_is_captured_in_a_cuda_graph_and_replays_right():
    """A decode step captured once in a CUDA graph (after an eager call, as serving code warms up) replays
    the table's kernel on new data written into the captured inputs, within the tolerances."""
    e = DECODE[0]
    dims, dt = dict(e.dims), dict(e.dtypes)
    t, kw = bench.inputs(dims, dt, 0)
    kf.fused_recurrent_kda(**t, **kw)  # eager first: a kernel the gate never ran is checked here, not in capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kf.fused_recurrent_kda(**t, **kw)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    before = dict(kf.stats()["fused_recurrent_kda"])
    with torch.cuda.graph(graph):
        o, final = kf.fused_recurrent_kda(**t, **kw)
    after = kf.stats()["fused_recurrent_kda"]
    assert after.get("table", 0) == before.get("table", 0) + 1, (before, after)  # captured the kernel, not torch
    t2, kw2 = bench.inputs(dims, dt, 1)
    for name, x in t.items():
        x.copy_(t2[name])
    kw["initial_state"].copy_(kw2["initial_state"])
    o.fill_(float("nan"))
    final.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert not bench.check(dims, t2, kw2, o, final)


def _near(**over) -> tuple[dict, dict]:
    dims, dt = dict(BASE.dims), dict(BASE.dtypes)
    var = {d: over.pop(d, dims[d]) for d in ("gate", "beta_act", "qk_l2norm", "v_first")}
    t = dims["T"] if DECODE else 64
    q = (over.pop("B", dims["B"]), over.pop("T", t), over.pop("H", dims["H"]), over.pop("K", dims["K"]))
    v = (q[0], q[1], over.pop("HV", q[2] * dims["HV"] // dims["H"]), over.pop("V", dims["V"]))
    dt = {**dt, **{r: over.pop(r) for r in ("x", "g") if r in over}}
    return call_dims(q, v, over.pop("N", None), var), dt


OFF = {
    "B3": {"B": 3}, "B1-T3": {"B": 1, "T": 3}, "B2-T64": {"B": 2, "T": 64}, "H2-HV4": {"B": 5, "H": 2, "HV": 4},
    "K64": {"B": 4, "K": 64}, "V64": {"B": 4, "V": 64}, "fp16": {"B": 3, "x": "float16"},
    "fp32": {"B": 3, "x": "float32"}, "l2-sigmoid": {"B": 2, "qk_l2norm": 1, "beta_act": 1},
    "neg-eigval": {"B": 2, "beta_act": 2}, "varlen": {"B": 1, "T": 9, "N": 3},
    # variants the recurrent template refuses: the torch path, still right
    "softplus-gate": {"B": 2, "gate": 1, "g": "bfloat16"}, "lower-bound-gate": {"B": 2, "gate": 2},
    "v-first": {"B": 2, "v_first": 1}, "long-T": {"B": 1, "T": 100},
}


@pytest.mark.skipif(not DECODE, reason="no decode cell exported")
@pytest.mark.parametrize("name", list(OFF))
def test_off_table_and_variant_calls_are_right_on_the_path_explain_names(name):
    dims, dt = _near(**dict(OFF[name]))
    problem, path = _run("fused_recurrent_kda", dims, dt, seed=1)
    assert not problem, problem
    assert path == _explained("fused_recurrent_kda", dims, dt), path


def test_fla_return_convention_and_no_initial_state():
    dims, dt = _near(B=2)
    t, kw = bench.inputs(dims, dt)
    call = getattr(kf, BASE_ENTRY)
    o, none = call(**t)
    assert none is None and o.dtype == t["v"].dtype
    o2, ht = call(**t, initial_state=kw["initial_state"].bfloat16(), output_final_state=True)
    assert ht.dtype == torch.float32  # fla: a new fp32 final state whatever the initial state's dtype
    s = {"scale": dims["K"] ** -0.5, "lower_bound": -5.0, **variant_dims()}
    assert not verify.check({**t, "initial_state": kw["initial_state"].bfloat16().float()}, s, o2, ht)
    zeros = torch.zeros_like(kw["initial_state"])
    o3, _ = call(**t, initial_state=zeros)
    assert torch.equal(o, o3)


def test_chunk_kda_runs_a_prefill_kernel_or_says_it_has_none():
    dims, dt = _near(B=1, T=64)
    t, _ = bench.inputs(dims, dt)
    if _explained("chunk_kda", dims, dt) == "missing":
        with pytest.raises(kf.MissingKernel, match="prefill"):
            kf.chunk_kda(**t)
    else:
        problem, _ = _run("chunk_kda", dims, dt)
        assert not problem, problem


def test_inputs_that_need_grad_take_the_differentiable_torch_path():
    dims, dt = _near(B=2)
    t, _ = bench.inputs(dims, dt)
    q = t.pop("q").float().requires_grad_()
    o, _ = getattr(kf, BASE_ENTRY)(q, **{n: x.float() for n, x in t.items()})
    o.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


PREFILL = [e for e in TABLE.entries if kind_of(TABLE.templates[e.template].name) == "prefill"
           and dict(e.dims)["N"] == dict(e.dims)["B"]]


@pytest.mark.skipif(not PREFILL, reason="no equal-length prefill cell exported")
def test_a_prefill_call_past_2_31_elements_is_right():
    """q, k (B, T, H, K) past 2^31 elements (an int32 offset would wrap): a searched prefill cell's kernel on B
    sequences of 1024 tokens, the first and last sequence against float64, on the path explain() names; skipped
    where the GPU lacks the memory."""
    e = PREFILL[0]
    dims, dt = dict(e.dims), dict(e.dtypes)
    t = 1024
    b = (1 << 31) // (t * dims["H"] * dims["K"]) + 1
    dims |= {"B": b, "N": b, "Ncu": b + 1, "T": t}
    need = b * t * dims["HV"] * dims["K"] * 40  # q, k, v, o, g, the float32 temporaries and the workspaces
    free, _ = torch.cuda.mem_get_info()
    if free < need:
        pytest.skip(f"SKIPPED: a call past 2^31 elements needs ~{need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free")
    assert b * t * dims["H"] * dims["K"] > 1 << 31
    problem, path = _run("chunk_kda", dims, dt)
    assert not problem and path == _explained("chunk_kda", dims, dt), (problem, path)
    torch.cuda.empty_cache()
