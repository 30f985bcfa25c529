"""The chunk template's algorithm (templates/kda/chunk.cu.j2), emulated in numpy: the same chunking, workspace layout
and precision as its two launches, so that its numerics can be judged on the CPU against the float64 reference
(ops/kda/reference.py). Launch 1 (emulate_prep): fla's variants formed on load (variant_prep), the fp32 cumulative decay
(or base 2 by fmaf, prep_exp = ex2), exact fp32 diagonal blocks or tf32 mma factored at each block's first token
(prep_diag = mma), fp32 forward substitution, w and u by tf32 or bf16 hi + lo mma.
Launch 2 (emulate_recur): S fp32, every mma operand bf16. A varlen batch by the kernel's slot map (varlen_slots).
prep_exp = fast and ex2 take their documented error bound, spent in one direction (exp_sign).

Used by tests/unit/test_kda_chunk.py (the emulation against the reference on every fill kind, and the fake device's
kernels) and to estimate the tolerance share a template change would spend before it is built."""

from __future__ import annotations

import numpy as np

from ops.kda.reference import BetaAct, Gate
from ops.kda.spec import FACTOR_SPAN, LOWER_BOUND, cell, variant_of
from evo.core.spec import Cell, DType, quantize

BF = DType.BF16
f32 = np.float32

# ---- the rounding and the products ---------------------------------------------------------------------

def bf(x: np.ndarray) -> np.ndarray:
    """Round to bf16 (nearest even), as cvt.rn.bf16x2.f32."""
    return quantize(np.asarray(x, np.float64), BF).astype(f32)


def tf(x: np.ndarray) -> np.ndarray:
    """Round to tf32 (nearest, ties away from zero), as cvt.rna.tf32.f32."""
    b = np.asarray(x, f32).view(np.uint32).astype(np.uint64)
    return (((b + 0x1000) & 0xFFFFE000).astype(np.uint32)).view(f32)


def mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """An mma product of already-rounded operands, accumulated exactly and rounded to fp32."""
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(f32)


def fast_exp(x: np.ndarray, sign: int) -> np.ndarray:
    """__expf at the edge of its documented error, 2 + floor(1.173 |x|) ulp (taken as 2 + 1.2 |x| ulp of
    2^-23 relative each), all in one direction (the worst case for sums and for the state's product of
    decays); results below the smallest normal flush to zero (ex2.approx.ftz)."""
    x64 = np.asarray(x, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.exp(x64) * (1 + sign * (2 + 1.2 * np.abs(x64)) * 2.0**-23)
        y = np.where(np.abs(y) < 2.0**-126, 0.0, y).astype(f32)
    return y


LOG2E = f32(1.44269504088896341)  # the kernel's constant, rounded to fp32


def ex2_model(x: np.ndarray, sign: int) -> np.ndarray:
    """ex2.approx.ftz.f32 of a base-2 argument at 4 ulp (twice exp2f's documented 2) of 2^-23 relative each, all in one
    direction; results below the smallest normal flush to zero."""
    x64 = np.asarray(x, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.exp2(x64) * (1 + sign * 4 * 2.0**-23)
        y = np.where(np.abs(y) < 2.0**-126, 0.0, y).astype(f32)
    return y


def base2_cumsum(g: np.ndarray, axis: int) -> np.ndarray:
    """prep_exp = ex2's G: the log decay times LOG2E summed along `axis` by fmaf (the exact product and sum, one
    rounding to fp32 a step: a product of two fp32 is exact in float64)."""
    g = np.moveaxis(np.asarray(g, f32), axis, 0)
    out = np.empty_like(g)
    acc = np.zeros(g.shape[1:], f32)
    for t in range(g.shape[0]):
        acc = (acc.astype(np.float64) + g[t].astype(np.float64) * np.float64(LOG2E)).astype(f32)
        out[t] = acc
    return np.moveaxis(out, 0, axis)


# ---- launch 1 -------------------------------------------------------------------------------------------

def variant_prep(inputs: dict, c: Cell, lower_bound: float = LOWER_BOUND) -> dict[str, np.ndarray]:
    """Launch 1's variant arithmetic on load, per token, in fp32 as the kernel does it: q, k [B, T, H, K] scaled
    by 1 / sqrt(sum x^2 + 1e-6) (qk_l2norm; the raw bf16 value times the fp32 factor, where each is read); the
    log decay a [B, T, HV, K] from the raw g (gate 1: -exp(A_log) (y > 20 ? y : log1p(exp(y))), gate 2:
    lower_bound (1 / (1 + exp(-(exp(A_log) y)))), y = g + dt_bias); beta (beta_act: m / (1 + exp(-x)), m = 1, 2)."""
    var = variant_of(c)
    HV, K = c.dim("HV"), c.dim("K")
    q, k, v, g, beta = (np.asarray(inputs[n], f32) for n in ("q", "k", "v", "g", "beta"))
    if var.qk_l2norm:
        q, k = (x * (f32(1) / np.sqrt(np.sum(x * x, axis=-1, keepdims=True, dtype=f32) + f32(1e-6))) for x in (q, k))
    with np.errstate(over="ignore"):
        if var.gate is not Gate.LOG:
            rate = np.exp(np.asarray(inputs["A_log"], f32))[:, None]
            y = g + np.asarray(inputs["dt_bias"], f32).reshape(HV, K)
            if var.gate is Gate.SOFTPLUS:
                g = -rate * np.where(y > f32(20), y, np.log1p(np.exp(y)))
            else:
                g = f32(lower_bound) * (f32(1) / (f32(1) + np.exp(-(rate * y))))
        if var.beta_act is not BetaAct.NONE:
            beta = f32(2 if var.beta_act is BetaAct.SIGMOID2 else 1) / (f32(1) + np.exp(-beta))
    return {"q": q, "k": k, "v": v, "g": g.astype(f32), "beta": beta.astype(f32)}


DIAG_RANGE = FACTOR_SPAN  # prep_diag = mma's bound on |G_t - G_b0| within a diagonal block (the kernel's DIAG_RANGE)


def diag_is_wide(G: np.ndarray, bound: np.float32 = f32(DIAG_RANGE)) -> np.ndarray:
    """prep_diag = mma's per-chunk flag from G [..., C, K] (fp32 sums): some channel moves by more than DIAG_RANGE from
    a diagonal block's first token within the block (those chunks take the exact per-pair diagonal). prep_exp = ex2
    passes its base-2 G and the bound in base 2 (f32(DIAG_RANGE) * LOG2E, as the kernel's constant)."""
    blocks = G.reshape(*G.shape[:-2], G.shape[-2] // 16, 16, G.shape[-1])
    return (np.abs(blocks - blocks[..., :1, :]) > bound).any(axis=(-3, -2, -1))


def forward_substitution(akk: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """(I + diag(beta) A)^-1 for A [..., n, n] strictly lower (its upper part ignored), row by row in fp32 sums."""
    n = akk.shape[-1]
    tinv = np.zeros_like(akk)
    for i in range(n):
        acc = np.einsum("...m,...mj->...j", akk[..., i, :i], tinv[..., :i, :]).astype(f32)
        row = -beta[..., i, None] * acc
        row[..., i] = 1.0
        row[..., i + 1:] = 0.0
        tinv[..., i, :] = row
    return tinv


def emulate_prep(inputs: dict, c: Cell, p: dict, scale: float, exp_sign: int = 1,
                 lower_bound: float = LOWER_BOUND) -> dict[str, np.ndarray]:
    """Launch 1: the workspace, [B * HV * NT] chunks in the kernel's layouts (qg [C, K], kgT [K, C],
    -w [C, K], A_qk [C, C] as bf16 values; u [C, V], gl [K] fp32). With prep_exp = fast every exponential
    errs by fast_exp's bound in the direction exp_sign. The cell's variant as variant_prep, then the same."""
    B, T, H, HV = (c.dim(d) for d in ("B", "T", "H", "HV"))
    C = p["chunk"]
    ex = (lambda x: fast_exp(x, exp_sign)) if p.get("prep_exp") == "fast" else np.exp
    base2 = p.get("prep_exp") == "ex2"  # G in base 2, every exponential one ex2 (ex2_model)
    if base2:
        ex = lambda x: ex2_model(x, exp_sign)  # noqa: E731
    NT = -(-T // C)
    grp = HV // H

    def chunks(x: np.ndarray) -> np.ndarray:  # [B, T, HV, ...] -> [B, HV, NT, C, ...], zero rows past T
        out = np.zeros((B, NT * C, *x.shape[2:]), f32)
        out[:, :T] = x
        return np.moveaxis(out.reshape(B, NT, C, *x.shape[2:]), 3, 1)

    pre = variant_prep(inputs, c, lower_bound)
    q, k = (chunks(np.repeat(pre[n], grp, axis=2)) for n in ("q", "k"))
    v, g, beta = (chunks(pre[n]) for n in ("v", "g", "beta"))
    s = f32(scale)
    # sequential fp32 sums, as the kernel's column loop
    G = base2_cumsum(g, 3) if base2 else np.cumsum(g, axis=3, dtype=f32)
    gl = G[..., -1:, :]
    ws = {"qg": bf(s * q * ex(G)), "kgT": np.swapaxes(bf(k * ex(gl - G)), -1, -2), "gl": ex(gl[..., 0, :])}
    akk = np.zeros((*G.shape[:-1], C), f32)
    aqk = np.zeros_like(akk)
    tri = np.tril(np.ones((16, 16), bool))
    wide = None
    bound = f32(DIAG_RANGE) * LOG2E if base2 else f32(DIAG_RANGE)
    if p.get("prep_diag") == "mma":
        wide = diag_is_wide(G, bound) if base2 else diag_is_wide(G)
    for blk in range(C // 16):
        rs = slice(16 * blk, 16 * blk + 16)
        gi = G[..., rs, :]
        with np.errstate(over="ignore"):  # the upper triangle, masked: the kernel never forms it
            e = np.where(tri[:, :, None], ex(gi[..., :, None, :] - gi[..., None, :, :]), 0).astype(f32)
        kd = k[..., None, rs, :] * e  # [.., i, j, c] = k_j exp(G_i - G_j)
        akk[..., rs, rs] = (np.einsum("...ic,...ijc->...ij", k[..., rs, :], kd) * np.tri(16, k=-1)).astype(f32)
        aqk[..., rs, rs] = np.einsum("...ic,...ijc->...ij", q[..., rs, :], kd).astype(f32)
        if wide is not None:  # prep_diag = mma: tf32 products factored at the block's first token, unless wide
            r = 16 * blk
            with np.errstate(over="ignore", invalid="ignore"):  # only a wide chunk's factors overflow: not taken
                fa = ex(gi - G[..., r:r + 1, :])
                kr = np.swapaxes(tf(k[..., rs, :] * ex(G[..., r:r + 1, :] - gi)), -1, -2)
                mk, mq = mm(tf(k[..., rs, :] * fa), kr), mm(tf(q[..., rs, :] * fa), kr)
            w = wide[..., None, None]
            akk[..., rs, rs] = np.where(w, akk[..., rs, rs], np.where(np.tri(16, k=-1, dtype=bool), mk, 0))
            aqk[..., rs, rs] = np.where(w, aqk[..., rs, rs], np.where(tri, mq, 0))
        if blk:
            r = 16 * blk
            fa = ex(gi - G[..., r:r + 1, :])
            kr = np.swapaxes(tf(k[..., :r, :] * ex(G[..., r:r + 1, :] - G[..., :r, :])), -1, -2)
            akk[..., rs, :r] = mm(tf(k[..., rs, :] * fa), kr)
            aqk[..., rs, :r] = mm(tf(q[..., rs, :] * fa), kr)
    ws["aqk"] = bf(s * aqk)
    tinv = forward_substitution(akk, beta)
    if p.get("prep_wu") == "bf16":  # bf16 mma: Tinv diag(beta) as hi + lo bf16, k exp(G) rounded to bf16, v as staged
        tb = (tinv * beta[..., None, :]).astype(f32)
        hi = bf(tb)
        lo = bf(tb - hi)
        xk = bf(k * ex(G))
        ws["w"] = bf(-(mm(hi, xk) + mm(lo, xk)))
        ws["u"] = mm(hi, v) + mm(lo, v)
    else:
        t32 = tf(tinv)
        ws["w"] = bf(-mm(t32, tf(beta[..., None] * k * ex(G))))
        ws["u"] = mm(t32, tf(beta[..., None] * v))
    return {n: a.reshape(B * HV * NT, *a.shape[3:]) for n, a in ws.items()}


# ---- launch 2, and both ----------------------------------------------------------------------------------

def emulate_recur(ws: dict[str, np.ndarray], h0: np.ndarray, c: Cell, p: dict) -> dict[str, np.ndarray]:
    """Launch 2 from the workspace: per chunk v_new = u - w S, o = qg S + A_qk v_new, S = gl S + kg^T v_new,
    S fp32 and every mma operand bf16 (S as hi + lo with state_split); v_first: h0 and the final state [V, K]."""
    B, T, HV, K, V = (c.dim(d) for d in ("B", "T", "HV", "K", "V"))
    vf = variant_of(c).v_first
    C = p["chunk"]
    NT = -(-T // C)
    w, qg, aqk, kgT, u, gl = (ws[n].reshape(B * HV, NT, *ws[n].shape[1:]) for n in ("w", "qg", "aqk", "kgT", "u", "gl"))
    if vf:
        S = np.swapaxes(np.asarray(h0, f32).reshape(B * HV, V, K), -1, -2).copy()
    else:
        S = np.asarray(h0, f32).reshape(B * HV, K, V).copy()
    o = np.full((B * HV, NT, C, V), np.nan, f32)
    for ci in range(NT):
        parts = [bf(S)]
        if p["state_split"]:
            parts.append(bf(S - parts[0]))
        vn, on = u[:, ci].copy(), np.zeros_like(u[:, ci])
        for part in parts:  # the kernel accumulates hi, then lo, per k-step: the same sums
            vn = vn + mm(w[:, ci], part)
            on = on + mm(qg[:, ci], part)
        vb = bf(vn)
        o[:, ci] = on + mm(aqk[:, ci], vb)
        S = S * gl[:, ci, :, None] + mm(kgT[:, ci], vb)
    o = np.moveaxis(o.reshape(B, HV, NT * C, V)[:, :, :T], 1, 2)
    S = np.swapaxes(S, -1, -2) if vf else S
    return {"o": quantize(o.astype(np.float64), c.dtype("x")), "final_state": S.astype(np.float64).reshape(B, HV, *S.shape[1:])}


def emulate(inputs: dict, scal: dict, c: Cell, p: dict, exp_sign: int = 1) -> dict[str, np.ndarray]:
    SR, SC, N, HV = (c.dim(d) for d in ("SR", "SC", "N", "HV"))
    h0 = inputs.get("initial_state", np.zeros((N, HV, SR, SC)))
    return emulate_recur(emulate_prep(inputs, c, p, scal["scale"], exp_sign, scal["lower_bound"]), h0, c, p)


# ---- a varlen batch -------------------------------------------------------------------------------------

def varlen_slots(cu: np.ndarray, C: int) -> list:
    """kda_chunk_prep's map of its grid's x (a workspace slot) to (sequence, first token, tokens), None for a
    gap slot: varlen_chunk's binary search, line for line."""
    N = len(cu) - 1
    out = []
    for ci in range(-(-int(cu[-1]) // C) + N - 1):
        lo, hi = 0, N - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cu[mid] // C + mid <= ci:
                lo = mid
            else:
                hi = mid - 1
        bos = int(cu[lo])
        t0 = (ci - bos // C - lo) * C
        n = min(C, int(cu[lo + 1]) - bos - t0)
        out.append((lo, bos + t0, n) if n > 0 else None)
    return out


def emulate_varlen(inputs: dict, scal: dict, c: Cell, p: dict, exp_sign: int = 1) -> dict[str, np.ndarray]:
    """The two launches on a varlen batch: launch 1 over the slots (varlen_slots; a slot's tokens past its
    sequence's end read as zeros, gap slots left NaN: never read), launch 2 per sequence over its slots
    cu[n] / C + n .. from the workspace, from its own initial state."""
    cu = np.asarray(inputs["cu_seqlens"], np.int64)
    H, HV, K, V, N, SR, SC = (c.dim(d) for d in ("H", "HV", "K", "V", "N", "SR", "SC"))
    var = variant_of(c)
    C = p["chunk"]
    slots = varlen_slots(cu, C)
    ns = len(slots)
    pre = variant_prep(inputs, c, scal["lower_bound"])  # per token: tokens past a sequence's end stay zeros
    padded = {}
    for name in ("q", "k", "v", "g", "beta"):
        x = pre[name][0]
        out = np.zeros((ns * C, *x.shape[1:]))
        for i, sl in enumerate(slots):
            if sl is not None:
                out[i * C:i * C + sl[2]] = x[sl[1]:sl[1] + sl[2]]
        padded[name] = out[None]
    cp = cell(c.dtype("x"), 1, ns * C, H, K, V, hv=HV)  # the variant's prep done above: launch 1 from there on
    ws = {n: a.reshape(HV, ns, *a.shape[1:]).copy() for n, a in emulate_prep(padded, cp, p, scal["scale"], exp_sign).items()}
    gaps = [i for i, sl in enumerate(slots) if sl is None]
    for a in ws.values():
        a[:, gaps] = np.nan
    h0 = np.asarray(inputs.get("initial_state", np.zeros((N, HV, SR, SC))))
    o = np.full((1, int(cu[-1]), HV, V), np.nan)
    ht = np.full((N, HV, SR, SC), np.nan)
    for n in range(N):
        bos, ln = int(cu[n]), int(cu[n + 1] - cu[n])
        s0, nt = bos // C + n, -(-ln // C)
        sub = {k: a[:, s0:s0 + nt].reshape(HV * nt, *a.shape[2:]) for k, a in ws.items()}
        r = emulate_recur(sub, h0[n:n + 1], cell(c.dtype("x"), 1, ln, H, K, V, hv=HV, variant=var), p)
        o[0, bos:bos + ln] = r["o"][0]
        ht[n] = r["final_state"][0]
    return {"o": o, "final_state": ht}


def emulate_cell(inputs: dict, scal: dict, c: Cell, p: dict, exp_sign: int = 1) -> tuple[dict, dict]:
    """(inputs as the reference gets them, the emulated outputs): by slots where there is cu_seqlens (a one-sequence
    cell given cu_seqlens = [0, T] when B = 1), else by batch rows."""
    if c.dim("B") == 1:
        inputs = {"cu_seqlens": np.array([0, c.dim("T")])} | inputs
        return inputs, emulate_varlen(inputs, scal, c, p, exp_sign)
    return inputs, emulate(inputs, scal, c, p, exp_sign)
