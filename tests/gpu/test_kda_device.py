"""On a GPU: KDA's float64 device reference against the numpy reference for every input kind (device
fills included), and the recurrent decode templates (per-CTA tiles, and the bulk-copy ring) through the real
gate, timed beside fla."""

from __future__ import annotations

import numpy as np
import pytest

from ops.kda import SPEC
from ops.kda import device as kda_device
from ops.kda.spec import DECODE_B, FILLS, cell, gate_cells, is_varlen, variant_of
from ops.kda.reference import Gate
from evo.core.spec import DType, from_device_bytes

RAW = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "int32": np.int32}
NULL = type("Null", (), {"ptr": 0, "nbytes": 0})()
DECODE = [c for c in SPEC.matrix() if c.dim("T") == 1]
# every edge cell, the decode cells' gate cells, and decode-shaped cells (B = 16 and an odd B at H = 32)
REF_CELLS = [*SPEC.edge_cells(), *gate_cells(DECODE[1]), cell(DType.BF16, 16, 1, 32), cell(DType.BF16, 5, 2, 32)]


@pytest.fixture(scope="module")
def worker():
    from evo.measure.worker import Worker

    return Worker()


def used_tensors(c, kind: str) -> set[str]:
    """What a plan for this cell binds: the raw gates' A_log/dt_bias, cu_seqlens when varlen, initial_state."""
    names = {"q", "k", "v", "g", "beta", "initial_state"}
    if variant_of(c).gate is not Gate.LOG:
        names |= {"A_log", "dt_bias"}
    if is_varlen(c):
        names.add("cu_seqlens")
    return names


@pytest.mark.gpu
@pytest.mark.parametrize("kind", list(FILLS))
@pytest.mark.parametrize("c", REF_CELLS, ids=lambda c: c.label())
def test_device_reference_matches_numpy_on_device_fills(worker, c, kind):
    _, ref_obj = worker._op("kda")
    used = used_tensors(c, kind)
    bufs: dict = {}
    ins = [t for t in SPEC.inputs() if t.name in used]
    bufs |= {t.name: NULL for t in SPEC.inputs() if t.name not in used}
    for i, t in enumerate(ins):
        dt, shape = t.resolve_dtype(c).value, t.shape(c)
        n = int(np.prod(shape))
        bufs[t.name] = worker.alloc(n * DType(dt).nbytes)
        worker.fill(bufs[t.name], dt, n, shape[-1], FILLS[kind][t.name].bind(c.dims_dict()), seed=101 + i)
    outs = SPEC.outputs()
    for t in outs:
        bufs[f"ref:{t.name}"] = worker.alloc(int(np.prod(t.shape(c))) * 8)
    scal = SPEC.scalar_values(c)
    for kernel, grid, block, args in kda_device.reference(c.dims_dict(), c.dtypes_dict(), scal):
        worker.launch(ref_obj, kernel, grid, block, 0, tuple(("ptr", bufs[v].ptr) if k == "buf" else (k, v) for k, v in args))
    worker.sync("kda reference")
    host = {}
    for t in ins:
        dt = t.resolve_dtype(c).value
        raw = worker.to_host(bufs[t.name].ptr, bufs[t.name].nbytes, RAW[dt])
        host[t.name] = from_device_bytes(raw, DType(dt)).reshape(t.shape(c))
    if "cu_seqlens" in host:
        cu = host["cu_seqlens"]
        assert cu[0] == 0 and cu[-1] == c.dim("T") and np.all(np.diff(cu) >= 1), cu
    if "q" in host and kind != "no_state":
        np.testing.assert_allclose(np.linalg.norm(host["q"], axis=-1), 1.0, atol=0.02)
    assert np.all(host["g"] < 0) and np.all((host["beta"] >= 0) & (host["beta"] <= 1))
    want = SPEC.reference(host, scal)
    for t in outs:
        got = worker.to_host(bufs[f"ref:{t.name}"].ptr, bufs[f"ref:{t.name}"].nbytes, np.float64).reshape(t.shape(c))
        w = want[t.name]
        rms = float(np.sqrt(np.mean(w * w)))
        assert np.all(np.isfinite(got)), (t.name, kind)
        assert np.max(np.abs(got - w)) <= 1e-10 * max(rms, 1e-300), (t.name, kind, c.label())
    for b in bufs.values():
        if b is not NULL:
            worker.free(b)


def _job(c, params=None, timing=None, baselines=(), template="recurrent"):
    from evo.build.nvrtc import compile_one, prepare
    from evo.core.genome import Genome
    from evo.measure.evaluate import make_job
    from evo.measure.evaluators import gate_cells_for
    from evo.templates.template import load_templates

    tdef = load_templates("kda")[template]
    g = Genome.make("kda", template, tdef.source_hash, tdef.default_params() | (params or {}))
    build = compile_one(prepare(tdef, g, "sm_90a", c.dtypes_dict(), c.dims_dict()))
    assert build.status.ok, build.error
    gates = gate_cells_for(SPEC, tdef, g, c, 90)
    job = make_job(SPEC, tdef, g, build, c, 90, seed=5, timing=timing, baseline=bool(baselines), gate_cells=gates,
                   baselines=baselines)
    return g, build, job


STAGED = {"qkg": "smem", "k_lanes": 4, "v_tile": 32, "vec": 2, "min_blocks": 8}  # q, k, exp(g) in shared memory


@pytest.mark.gpu
@pytest.mark.parametrize("c", DECODE, ids=lambda c: f"B{c.dim('B')}")
@pytest.mark.parametrize("params", [{}, STAGED], ids=["default", "qkg-smem"])
def test_recurrent_template_passes_the_gate_on_every_decode_cell(worker, c, params):
    from evo.core.status import Status
    from evo.measure.verify import judge

    g, build, job = _job(c, params)
    assert {"A_log", "dt_bias", "cu_seqlens"} <= set(job.left_out) and job.gate
    res = worker.run(job)
    out = judge(res, {k: t[2] for k, t in job.tolerances}, g, c, build.build_key)
    assert out.status is Status.OK, (out.status, out.error, res.checks[-3:])


@pytest.mark.gpu
@pytest.mark.parametrize("c", DECODE, ids=lambda c: f"B{c.dim('B')}")
@pytest.mark.parametrize("params", [{}, {"v_tile": 64, "vec": 2, "threads": 256, "rows_per_copy": 1, "stages": 3,
                                         "ctas": 264, "store_policy": "evict_first"},
                                    {"v_tile": 32, "vec": 1, "threads": 128, "rows_per_copy": 1, "stages": 4,
                                     "ctas": 396, "load_policy": "none"},
                                    {"store": "st", "store_policy": "evict_first"}],
                         ids=["bulk-default", "bulk-v64", "bulk-v32", "bulk-st"])
def test_recurrent_bulk_template_passes_the_gate_on_every_decode_cell(worker, c, params):
    """The bulk-copy ring (persistent grid, mbarriers, bulk stores) through the real gate and its gate cells."""
    from evo.core.status import Status
    from evo.measure.verify import judge

    g, build, job = _job(c, params, template="recurrent_bulk")
    assert {"A_log", "dt_bias", "cu_seqlens"} <= set(job.left_out) and job.gate
    res = worker.run(job)
    out = judge(res, {k: t[2] for k, t in job.tolerances}, g, c, build.build_key)
    assert out.status is Status.OK, (out.status, out.error, res.checks[-3:])


@pytest.mark.gpu
@pytest.mark.parametrize("template", ["recurrent", "recurrent_bulk"])
@pytest.mark.parametrize("b", [b for b in DECODE_B if b >= 64])
def test_recurrent_decode_timed_beside_fla(worker, b, template):
    """Timed with fla's fused_recurrent_kda in the same process (or fla reported absent): prints the
    state traffic's share of the copy ceiling (the decode target: >= 90% at B >= 64)."""
    from evo.core.status import Status
    from evo.measure.jobs import Timing
    from evo.measure.verify import judge

    c = next(x for x in DECODE if x.dim("B") == b)
    g, build, job = _job(c, timing=Timing(min_samples=100, max_samples=200), baselines=("fla.fused_recurrent_kda",),
                         template=template)
    res = worker.run(job)
    out = judge(res, {k: t[2] for k, t in job.tolerances}, g, c, build.build_key)
    assert out.status is Status.OK, (out.status, out.error)
    med = float(np.median(res.times_us))
    gbps = SPEC.bytes_moved(c) / (med * 1e-6) / 1e9
    peer = dict(res.peers).get("fla.fused_recurrent_kda")
    print(f"\nkda decode {template} B={b}: {med:.1f} us, {gbps:.0f} GB/s = {gbps / res.ceiling_gbps:.0%} of the copy ceiling; "
          + (f"fla {np.median(peer):.1f} us" if peer else f"fla absent: {dict(res.absent)}"))
    assert peer or "fla.fused_recurrent_kda" in dict(res.absent)


PREFILL = [c for c in SPEC.matrix() if c.dim("T") > 1 and not is_varlen(c)]
# the first run's best (chunk 32, 4 warps, 128 prep threads), then the data-movement options on and off
# kda_prefill_h200_4's fastest point (recur_lean + recur_ldsm; its split diagonal, a prep option since removed, as
# warp_row's), which the later prep options vary
LDSM = {"chunk": 32, "warps": 2, "stages": 6, "prep_threads": 256, "stage_in": True, "u_prefetch": True,
        "recur_lean": True, "recur_ldsm": True}
# the GA's point (kda_prefill_h200_5) with the elementwise outputs vectorized
VEC = LDSM | {"prep_threads": 128, "prep_round": "add", "prep_exp": "fast", "prep_vec": True}
# that point's prep with launch 2's K split across a value group's warps (kwarps; the one-warp-a-column
# recurrence's options off)
KSPLIT = {k: v for k, v in VEC.items() if k not in ("u_prefetch", "recur_lean", "recur_ldsm")}
# the diagonal blocks by tf32 mma (prep_diag = mma; decay_near_zero's chunks take the exact path): the one-warp
# recurrence and kwarps 2
MMA_W2 = VEC | {"prep_diag": "mma"}
MMA_K2 = KSPLIT | {"warps": 1, "kwarps": 2, "stages": 3, "prep_diag": "mma"}
# the mma prep's exponentials as one ex2.approx.ftz on a base-2 decay (prep_exp = ex2) and its shared-memory offsets
# from row and column apart (prep_addr = rowcol)
EX2_ROWCOL = {"prep_exp": "ex2", "prep_addr": "rowcol"}
# K split over 4 warps a group, 3-deep ring
K4 = KSPLIT | {"warps": 1, "kwarps": 4, "stages": 3}
# carry on the lean, ldmatrix-fed one-warp-a-column recurrence (its items' slots carried a chunk at a time, each kind's
# source a call at a time): kda_prefill_h200_15's B4/B8 point (ex2, rowcol, u_prefetch, warps 2, stages 6)
CARRY_W2 = MMA_W2 | EX2_ROWCOL | {"recur_addr": "carry"}
# carry on kwarps 2 (ex2, rowcol): kda_prefill_h200_15's B1-T8192 point
CARRY_K2 = MMA_K2 | EX2_ROWCOL | {"recur_addr": "carry"}
CHUNK_POINTS = [{"chunk": 32, "warps": 4, "prep_threads": 128},
                {"chunk": 32, "warps": 4, "prep_threads": 128, "stage_in": True, "u_prefetch": True, "prep_exp": "fast"},
                {"chunk": 64, "warps": 2, "stage_in": True},
                {"chunk": 32, "warps": 2, "stages": 6, "stage_in": True, "u_prefetch": True},
                {"chunk": 32, "warps": 2, "stages": 6, "stage_in": True, "u_prefetch": True, "recur_lean": True},
                LDSM,  # ldmatrix B fragments: bit-identical
                LDSM | {"recur_fuse": True},  # items 0, 1 fused
                LDSM | {"prep_round": "add", "prep_exp": "fast"},  # tf32 by one add, fast exp
                VEC,
                # K split: one warp, 4 warps a group, 3- and 4-deep rings; two groups, 3-deep
                K4, K4 | {"stages": 4}, K4 | {"warps": 2},
                MMA_W2, MMA_K2,
                MMA_W2 | EX2_ROWCOL, MMA_K2 | EX2_ROWCOL, MMA_K2 | {"prep_exp": "ex2"},  # both options; ex2 alone
                # the K-split recurrence's shared addresses as bases plus immediates (recur_addr = hoist): kwarps 2
                # (ex2, rowcol) and kwarps 4
                MMA_K2 | EX2_ROWCOL | {"recur_addr": "hoist"}, K4 | {"recur_addr": "hoist"},
                # hoist with the refill's sources, u's words and o's address carried from chunk to chunk
                # (recur_addr = carry): the same two recurrences, and kwarps 4 with two value groups and a 6-deep ring
                CARRY_K2, K4 | {"recur_addr": "carry"}, K4 | {"warps": 2, "stages": 6, "recur_addr": "carry"},
                # carry on the one-warp-a-column recurrence, and without u_prefetch at a 3-deep ring
                CARRY_W2, CARRY_W2 | {"u_prefetch": False, "stages": 3},
                # w, u by bf16 mma (prep_wu = bf16: Tinv diag(beta) as bf16 hi + lo, k exp(G) as bf16, ldmatrix
                # fragments) under the two carry recurrences
                CARRY_W2 | {"prep_wu": "bf16"}, CARRY_K2 | {"prep_wu": "bf16"},
                # the K-split carry recurrence reading u and exp(G_last) at the chunk's start, its refill without a
                # branch (recur_early): before the group's barrier (mid) at kwarps 2 and 4, after the state update
                # (late) at kwarps 2 (the gate's T = 1 and 3 cells: loop calls past the last chunk copy chunk NT - 1
                # again)
                CARRY_K2 | {"recur_early": "mid"}, CARRY_K2 | {"recur_early": "late"},
                K4 | {"recur_addr": "carry", "recur_early": "mid"},
                # v staged over q after the A phase (prep_v = late: 6 prep CTAs an SM) under the two carry
                # recurrences, the K-split one with recur_early late (experiments/seeds/kda_prefill_vlate.json)
                CARRY_W2 | {"prep_wu": "bf16", "prep_v": "late"},
                CARRY_K2 | {"prep_wu": "bf16", "prep_v": "late", "recur_early": "late"},
                # kda_prefill_h100_5's B1-T8192 point: two value groups of two warps, a 4-deep ring
                CARRY_K2 | {"warps": 2, "prep_wu": "bf16", "prep_v": "late", "recur_early": "late", "stages": 4}]


@pytest.mark.gpu
@pytest.mark.parametrize("params", CHUNK_POINTS, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()) or "default")
@pytest.mark.parametrize("c", PREFILL, ids=lambda c: c.label())
def test_chunk_template_passes_the_gate_on_every_prefill_cell_beside_fla(worker, c, params):
    """The chunked prefill through the real gate (its gate cells and the cell itself, every input set),
    then timed with fla's chunk_kda in the same process (or fla reported absent): prints the ratio, the
    prefill target (>= 2x fla)."""
    _chunk_beside_fla(worker, c, params, "kda chunk")


def _chunk_beside_fla(worker, c, params, tag: str) -> None:
    """The chunk template at `params` on cell `c` through the real gate, timed beside fla's chunk_kda in the
    same process (or fla reported absent); prints `tag` lines with the verdict and the ratio."""
    from evo.core.status import Status
    from evo.measure.jobs import Timing
    from evo.measure.verify import judge

    g, build, job = _job(c, params, timing=Timing(min_samples=20, max_samples=50), baselines=("fla.chunk_kda",),
                         template="chunk")
    res = worker.run(job)
    out = judge(res, {k: t[2] for k, t in job.tolerances}, g, c, build.build_key)
    print(f"\n{tag} {c.label()} {params}: {out.status.name} {out.error or ''} checks {res.checks[-4:]}")
    assert out.status is Status.OK, (out.status, out.error, res.checks[-4:])
    med = float(np.median(res.times_us))
    peer = dict(res.peers).get("fla.chunk_kda")
    print(f"{tag} {c.label()} {params}: {med:.1f} us; "
          + (f"fla {np.median(peer):.1f} us, {np.median(peer) / med:.2f}x" if peer else f"fla absent: {dict(res.absent)}"))
    assert peer or "fla.chunk_kda" in dict(res.absent)


# overlap (docs/kda_prefill_overlap.md): the recurrence on a side stream beside a chunk-major prep, each chunk's ring
# item copied once the prep's CTA published its flag; legal at B = 1 only (tests/unit/test_kda_chunk.py). The mma prep
# with kwarps 2 at the warps the CTA-count rule admits (2 at H = 32, 1 at H = 16), then its twin in order.
OVERLAP = KSPLIT | {"kwarps": 2, "stages": 3, "prep_diag": "mma", "overlap": True}


# The overlapped plan itself (overlap = True) is not run here: beside the gate's kernel holding most SMs its
# recurrence waits for flags whose prep CTAs cannot start and traps after 2 s, which ends this process's CUDA context
# (docs/kda_prefill_overlap.md). The gate rejects it; no search space offers it.
@pytest.mark.gpu
@pytest.mark.parametrize("overlap", [False], ids=["in-order"])
@pytest.mark.parametrize("c", [c for c in PREFILL if c.dim("B") == 1], ids=lambda c: c.label())
def test_chunk_recurrence_beside_the_prep_passes_the_gate_beside_fla(worker, c, overlap):
    """The overlapped plan's in-order twin (the chunk-major prep, then the recurrence) through the real gate and
    timed beside fla."""
    params = OVERLAP | {"warps": 2 if c.dim("HV") == 32 else 1, "overlap": overlap}
    _chunk_beside_fla(worker, c, params, "kda overlap" if overlap else "kda in order")


# fla's default call on variable-length batches (B = 1, cu_seqlens): uneven sequences packed along T
VARLEN = [cell(DType.BF16, 1, 8192, 32, n=8), cell(DType.BF16, 1, 1000, 16, n=5)]
VARLEN_POINTS = [{"chunk": 32, "warps": 2, "stages": 6, "stage_in": True, "u_prefetch": True},
                 {"chunk": 64, "warps": 2, "stage_in": True},
                 {"chunk": 32, "warps": 2, "stages": 6, "stage_in": True, "u_prefetch": True, "prep_diag": "mma",
                  "prep_vec": True, "prep_round": "add", "prep_exp": "fast", "prep_threads": 128},
                 CARRY_K2 | {"warps": 2, "prep_wu": "bf16", "prep_v": "late", "recur_early": "late"}]


@pytest.mark.gpu
@pytest.mark.parametrize("params", VARLEN_POINTS, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
@pytest.mark.parametrize("c", VARLEN, ids=lambda c: c.label())
def test_chunk_template_passes_the_gate_on_varlen_batches_beside_fla(worker, c, params):
    """The chunk template's cu_seqlens path (chunks never crossing a sequence) through the real gate, every
    input set, timed beside fla's chunk_kda given the same cu_seqlens."""
    _chunk_beside_fla(worker, c, params, "kda varlen chunk")


@pytest.mark.gpu
@pytest.mark.parametrize("params", [{}, STAGED], ids=["default", "qkg-smem"])
def test_recurrent_template_passes_the_gate_on_a_short_varlen_batch(worker, params):
    """The decode template's cu_seqlens path (sequence n = tokens cu[n]..cu[n+1]) through the real gate."""
    from evo.core.status import Status
    from evo.measure.verify import judge

    c = cell(DType.BF16, 1, 40, 32, n=6)
    g, build, job = _job(c, params)
    res = worker.run(job)
    out = judge(res, {k: t[2] for k, t in job.tolerances}, g, c, build.build_key)
    print(f"\nkda varlen recurrent {c.label()}: {out.status.name} {out.error or ''}")
    assert out.status is Status.OK, (out.status, out.error, res.checks[-4:])
