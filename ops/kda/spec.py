"""Kimi Delta Attention forward on fla's surface: signature, variants, matrix, inputs, tolerances, bytes.

fla's `chunk_kda` and `fused_recurrent_kda` (commit reference.FLA_COMMIT) take q, k [B, T, H, K],
v [B, T, HV, V], g [B, T, HV, K], beta [B, T, HV], optional A_log [HV] and dt_bias [HV * K] (declared
here as [HV, K], the same memory), optional initial_state and cu_seqlens, and return o [B, T, HV, V]
and the final state. reference.py gives the formulas.

Variants. Four switches change what is computed; a cell carries each as an integer dim, so templates
(`is_valid`, `plan`), the store and cell labels see them like shapes, and the scalars of the same
names mirror them (their defaults read the cell) because the reference receives scalars, not cells:
    gate       Gate: 0 LOG (g is the log decay), 1 SOFTPLUS (-exp(A_log) softplus(g + dt_bias) in the
               kernel), 2 LOWER_BOUND (the safe gate: lower_bound sigmoid(exp(A_log) (g + dt_bias)))
    beta_act   BetaAct: 0 NONE (beta is post-sigmoid), 1 SIGMOID (beta holds logits), 2 SIGMOID2
               (2 sigmoid: fla's allow_neg_eigval)
    qk_l2norm  1: q and k are L2-normalized in the kernel (fla's use_qk_l2norm_in_kernel)
    v_first    1: states are [N, HV, V, K] (fla's state_v_first)
The state dims are SR x SC: K x V, or V x K with v_first; `cell()` keeps them (and Ncu) consistent,
since a TensorSpec dim is a name, not an expression. The other scalars are scale (K^-1/2 by default,
as fla's) and lower_bound (-5, read by gate 2 only).

Dtypes: role "x" covers q, k, v, beta and o (the model's activation dtype; o takes v's dtype in fla);
role "g" is g's dtype: fp32 for a log-space decay (chunked kernels sum it over up to T tokens, and
bf16 would turn small decays into visible error), the activation dtype for a raw gate; role "state"
is both states': fp32, or bf16 as an in-place decode cache (fla's `chunk_kda` asserts an fp32 initial
state and writes an fp32 final one; `fused_recurrent_kda` reads any dtype, and its in-place path
writes the final state into the initial state's buffer and dtype). A_log and dt_bias are fp32.

Dims: B, T, H, HV, K, V as in fla; N is the number of sequences (N = B for a batch of equal lengths;
B = 1 and N > 1 for a variable-length batch) and Ncu = N + 1 the length of cu_seqlens.
"""

from __future__ import annotations

import math
import random
from typing import Callable

import numpy as np

from ops.kda.reference import BetaAct, Gate, Variant, kda_fwd, sigmoid
from evo.core.spec import (
    Causal,
    Cell,
    DType,
    FillSpec,
    OpSpec,
    Recurrence,
    Role,
    ScalarSpec,
    TensorSpec,
    Tolerance,
    draw_lengths,
    log_uniform,
    quantize,
    uniform,
)

INPUT_KINDS = ("normal", "no_state", "decay_near_one", "decay_near_zero", "gate_at_bound", "decay_at_factor_limit",
               "beta_large", "varlen")
# The largest span of log decay a 16-token block may have for a chunked kernel to factor its diagonal block's decay
# at the block's first token (fp32 factors within exp(+-60) of 1: templates/kda/chunk.cu.j2's DIAG_RANGE, which takes
# the exact per-pair path past it). decay_at_factor_limit's per-token decay spans just under it across 15 steps.
FACTOR_SPAN = 60.0
FACTOR_LIMIT_DECAY = 0.9925 * FACTOR_SPAN / 15  # 3.97 a token: a block's span 59.6 +- 0.15
VARIANT_DIMS = ("gate", "beta_act", "qk_l2norm", "v_first")
STATE_DTYPES = (DType.FP32, DType.BF16)
LOWER_BOUND = -5.0  # fla's recommended lower bound, the edge of its safe-gate range [-5, 0)
FLA_DEFAULT = Variant()  # fla's default call: log-space g, post-sigmoid beta, no L2 norm, K-first state

# The check that matters is the RMS-relative error against float64 (rel_norm): 0.005 for bf16, as
# the op's contract asks of o and the final state. atol/rtol only catch a few elements gone badly wrong; state
# entries are ~4x those of o. tests/unit/test_kda_spec.py calibrates them: an fp32 recurrence that
# rounds only what it stores (o, final_state) is >= 2x inside on every edge cell and input kind, and
# kernels with one classic bug each fail some kind. A kernel that rounds where fla's chunk_kda does
# (every tensor-core operand, and A, w, u, h stored in bf16) emulates to 0.6-0.85 of the bf16 bound
# on most kinds and 0.9-1.2 of it on decay_near_one (worst with beta up to 2, or L2 norm output in
# bf16): meeting 0.005 there takes keeping some intermediates wider than fla keeps them.
O_TOLERANCES = {
    DType.FP32: Tolerance(atol=1e-4, rtol=1e-3, rel_norm=2e-5),
    DType.FP16: Tolerance(atol=2e-3, rtol=1e-2, rel_norm=1.5e-3),
    DType.BF16: Tolerance(atol=2e-2, rtol=5e-2, rel_norm=5e-3),
}
STATE_TOLERANCES = {
    DType.FP32: Tolerance(atol=4e-4, rtol=1e-3, rel_norm=2e-5),
    DType.FP16: Tolerance(atol=6e-3, rtol=1e-2, rel_norm=1.5e-3),
    DType.BF16: Tolerance(atol=6e-2, rtol=5e-2, rel_norm=5e-3),
}
_PRECISION = {DType.FP32: 0, DType.FP16: 1, DType.BF16: 2}


def cell(
    dtype: DType | str, b: int, t: int, h: int, k: int = 128, v: int = 128, n: int | None = None,
    hv: int | None = None, *, g: DType | str = DType.FP32, state: DType | str = DType.FP32,
    variant: Variant = FLA_DEFAULT,
) -> Cell:
    """A cell; n (sequences) defaults to b, n != b makes a variable-length batch (needs b = 1); hv
    (value heads) defaults to h."""
    n = b if n is None else n
    hv = h if hv is None else hv
    if n != b and not (b == 1 and 1 <= n <= t):
        raise ValueError(f"kda cell: N = {n} sequences needs B = 1 and N <= T, got B = {b}, T = {t}")
    if h < 1 or hv % h:
        raise ValueError(f"kda cell: HV = {hv} value heads is not a multiple of H = {h}")
    state = state if isinstance(state, DType) else DType.parse(state)
    if state not in STATE_DTYPES:
        raise ValueError(f"kda cell: state dtype {state.short} is not one of fp32, bf16")
    sr, sc = (v, k) if variant.v_first else (k, v)
    dims = {"B": b, "T": t, "H": h, "HV": hv, "K": k, "V": v, "N": n, "Ncu": n + 1, "SR": sr, "SC": sc}
    return Cell.make({"x": dtype, "g": g, "state": state}, dims | variant.scalars())


def variant_of(cell: Cell) -> Variant:
    """The variant a cell carries in its dims."""
    return Variant.from_scalars({d: cell.dim(d) for d in VARIANT_DIMS})


def raw_gate(cell: Cell) -> bool:
    """Whether the cell's gate is computed in the kernel (gate 1 or 2: A_log and dt_bias are read)."""
    return cell.dims_dict().get("gate", 0) != 0


def has_state(cell: Cell) -> bool:
    """Every KDA cell carries its recurrent states (bytes_moved counts them; no_state fills zeros): a plan
    that binds no initial_state or final_state computes another op than its cell's."""
    return True


def is_varlen(cell: Cell) -> bool:
    """Whether the cell packs several sequences into B = 1 (so cu_seqlens is always present)."""
    return cell.dim("N") != cell.dim("B")


def kinds_for(cell: Cell) -> tuple[str, ...]:
    """The input kinds that fit the cell: "varlen" needs B = 1."""
    return INPUT_KINDS if cell.dim("B") == 1 else tuple(k for k in INPUT_KINDS if k != "varlen")


def make_inputs(cell: Cell, kind: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Float64 arrays already rounded to the cell's dtypes (cu_seqlens as integers).

    Every kind draws a target log decay per channel and turns it into the g (with A_log, dt_bias)
    the cell's gate needs, so each kind means the same decays under every gate; and beta logits,
    given as sigmoid(logits) when the kernel applies no activation.
    normal: v ~ N(0, 1); q, k unit rows (as fla's callers pass them), or rows of norm 0.1..10 for a
        kernel that normalizes; decay exp(-exp(N(-2, 1))), median 0.87; logits N(0, 1); a random
        initial_state of entries ~K^-1/2 (a state maps unit keys to values of size ~1).
    no_state: as normal without initial_state (the kernel starts from zeros).
    decay_near_one: 1 - decay ~ 3e-4: the state remembers the whole sequence.
    decay_near_zero: log decay ~ -12 (-5 to -33; the lower-bound gate stops at lower_bound): each
        token all but erases the state, and exp of a chunk's cumulative decay underflows in fp32.
    gate_at_bound: every log decay at fla's safe-gate lower bound (-5, within 0.1% inside it): the largest decay
        a chunked factorization for bounded gates admits on every token, so a chunk's cumulative decay spans
        5 x its tokens (160 at chunk 32: exp of it overflows fp32 wherever it is not factored per block).
    decay_at_factor_limit: log decay -3.97 a token (+-1%, per channel): a 16-token block's decay spans 59.6 +- 0.15,
        just under FACTOR_SPAN, so a kernel that factors a block's decay at its first token does it with factors
        near exp(+-60), the largest it admits, and some chunks pass the bound (the exact path).
    beta_large: logits +-8..100 (log-uniform): beta saturates at 0 and 1 (or 2), and a sigmoid computed
        as exp(x) / (1 + exp(x)) in fp32 turns to NaN above 88.
    varlen: B = 1 with cu_seqlens: a varlen cell gets sequences of 1..3 tokens beside one of at
        least half the tokens; a cell of one sequence gets cu_seqlens = [0, T]. Needs B = 1.
    A varlen cell (N != B) gets cu_seqlens of uneven lengths under every kind. Long sequences come
    from cells (T = 32768 in the matrix, 300 among edge cells) and the varlen kind's long sequence;
    decay_near_one makes their whole length matter.
    """
    if kind not in INPUT_KINDS:
        raise ValueError(f"kda has no input kind {kind!r}; expected one of {INPUT_KINDS}")
    if kind == "varlen" and cell.dim("B") != 1:
        raise ValueError(f"kda input kind 'varlen' needs B = 1, cell {cell.label()} has B = {cell.dim('B')}")
    b, t, h, hv, dk, dv, n = (cell.dim(d) for d in ("B", "T", "H", "HV", "K", "V", "N"))
    var = variant_of(cell)
    x = cell.dtype("x")

    q, k = (_qk_rows(rng, (b, t, h, dk), var.qk_l2norm) for _ in range(2))
    v = rng.standard_normal((b, t, hv, dv))
    ln_rate = {"decay_near_one": (-8.0, 1.0), "decay_near_zero": (2.5, 0.5)}.get(kind, (-2.0, 1.0))
    target = -np.exp(rng.normal(*ln_rate, (b, t, hv, dk)))
    if kind == "gate_at_bound":
        target = LOWER_BOUND * (1.0 - 1e-3 * rng.uniform(size=(b, t, hv, dk)))
    if kind == "decay_at_factor_limit":
        target = -FACTOR_LIMIT_DECAY * np.exp(rng.normal(0.0, 0.01, (b, t, hv, dk)))
    if kind == "beta_large":
        logits = rng.choice([-1.0, 1.0], (b, t, hv)) * 10.0 ** rng.uniform(np.log10(8.0), 2.0, (b, t, hv))
    else:
        logits = rng.standard_normal((b, t, hv))
    beta = sigmoid(logits) if var.beta_act is BetaAct.NONE else logits
    out = {"q": quantize(q, x), "k": quantize(k, x), "v": quantize(v, x), "beta": quantize(beta, x)}
    out |= _gate_inputs(target, var.gate, cell.dtype("g"), rng)
    if kind != "no_state":
        s0 = rng.standard_normal((n, hv, cell.dim("SR"), cell.dim("SC"))) / np.sqrt(dk)
        out["initial_state"] = quantize(s0, cell.dtype("state"))
    if kind == "varlen" or is_varlen(cell):
        lengths = _extreme_lengths(t, n, rng) if kind == "varlen" else _uneven_lengths(t, n, rng)
        out["cu_seqlens"] = quantize(np.concatenate([[0], np.cumsum(lengths)]), DType.INT32)
    return out


def _qk_rows(rng: np.random.Generator, shape: tuple[int, ...], l2norm_in_kernel: bool) -> np.ndarray:
    rows = rng.standard_normal(shape)
    rows /= np.linalg.norm(rows, axis=-1, keepdims=True)
    if l2norm_in_kernel:
        rows *= 10.0 ** rng.uniform(-1.0, 1.0, (*shape[:-1], 1))
    return rows


def _gate_inputs(target: np.ndarray, gate: Gate, gdtype: DType, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """g (and A_log, dt_bias) whose log decay under `gate` is near `target` (exactly, before rounding)."""
    hv, dk = target.shape[-2:]
    if gate is Gate.LOG:
        return {"g": quantize(target, gdtype)}
    if gate is Gate.SOFTPLUS:
        # fla's KDA layer init: A_log = log U(1, 16); dt_bias = softplus^-1 of dt in [1e-3, 0.1].
        a_log = np.log(rng.uniform(1.0, 16.0, hv))
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), (hv, dk)))
        dt_bias = _softplus_inv(dt)
        y = -target / np.exp(a_log)[:, None]  # softplus(g + dt_bias)
        raw = _softplus_inv(y) - dt_bias
    else:
        a_log = rng.normal(0.0, 0.3, hv)  # fla's safe-gate layer starts at A_log = 0
        dt_bias = rng.normal(0.0, 0.5, (hv, dk))
        y = np.clip(target / LOWER_BOUND, 1e-7, 1.0 - 1e-4)  # sigmoid(exp(A_log) (g + dt_bias))
        raw = np.log(y / (1.0 - y)) / np.exp(a_log)[:, None] - dt_bias
    return {"g": quantize(raw, gdtype), "A_log": quantize(a_log, DType.FP32), "dt_bias": quantize(dt_bias, DType.FP32)}


def _softplus_inv(y: np.ndarray) -> np.ndarray:
    return y + np.log(-np.expm1(-y))


def _uneven_lengths(t: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """n positive lengths summing to t: squared exponential weights give a few long and several short."""
    weights = rng.exponential(size=n) ** 2
    return 1 + rng.multinomial(t - n, weights / weights.sum())


def _extreme_lengths(t: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """n positive lengths summing to t: about a third of them 1..3 tokens (one exactly 1), one holding
    at least three quarters of what the short ones leave, the rest uneven; in random order."""
    if n == 1:
        return np.array([t])
    lengths = np.ones(n, dtype=np.int64)
    spare = t - n
    n_short = max(1, n // 3)
    for i in range(1, n_short):  # sequence 0 stays at length 1
        extra = min(int(rng.integers(0, 3)), spare)
        lengths[i] += extra
        spare -= extra
    long_extra = spare - spare // 4
    rest = np.arange(n_short + 1, n)
    if len(rest):
        weights = rng.exponential(size=len(rest)) ** 2
        lengths[rest] += rng.multinomial(spare - long_extra, weights / weights.sum())
    else:
        long_extra = spare
    lengths[n_short] += long_extra
    return rng.permutation(lengths)


def tolerance(cell: Cell, output: str) -> Tolerance:
    """o by the x dtype. final_state by its own dtype on a one-token cell (one fp32 step from exact inputs: an
    error there compounds over a decode loop), by the coarser of x and the state dtype over several tokens
    (a chunked kernel's tensor-core operands, fla's chunk_kda's too, are rounded to the activation dtype)."""
    x = cell.dtype("x")
    if output == "o":
        return O_TOLERANCES[x]
    if output == "final_state":
        state = cell.dtype("state")
        if cell.dim("T") == 1:
            return STATE_TOLERANCES[state]
        return STATE_TOLERANCES[max(x, state, key=_PRECISION.__getitem__)]
    raise KeyError(f"kda has no output {output!r}")


def io_bytes(cell: Cell, initial_state: bool, final_state: bool, cu_seqlens: bool) -> int:
    """Each input read once, each output written once, for the given optional tensors (A_log and
    dt_bias whenever the cell's gate is computed in the kernel)."""
    b, t, h, hv, dk, dv, n = (cell.dim(d) for d in ("B", "T", "H", "HV", "K", "V", "N"))
    xb, gb, sb = (cell.dtype(r).nbytes for r in ("x", "g", "state"))
    total = b * t * (2 * h * dk * xb + hv * (dv * xb + dk * gb + xb))  # q, k, v, g, beta
    total += b * t * hv * dv * xb  # o
    total += n * hv * dk * dv * sb * (int(initial_state) + int(final_state))
    if variant_of(cell).gate is not Gate.LOG:
        total += hv * (1 + dk) * DType.FP32.nbytes  # A_log, dt_bias
    total += (n + 1) * DType.INT32.nbytes * int(cu_seqlens)
    return total


def bytes_moved(cell: Cell) -> int:
    """Full I/O: every input read (initial_state included) and o and final_state written, plus
    cu_seqlens for a varlen cell. At decode (T = 1) the states are nearly all of it."""
    return io_bytes(cell, initial_state=True, final_state=True, cu_seqlens=is_varlen(cell))


def flops(cell: Cell) -> int:
    """The recurrent form per token and value head: decay K*V, S^T k 2KV, rank-1 update 2KV, S^T q
    2KV, plus exp(g), scale*q, v - S^T k and beta*(...); gates and norms (O(K) per token) are left out,
    and chunked kernels do more, for the tensor cores."""
    b, t, hv, dk, dv = (cell.dim(d) for d in ("B", "T", "HV", "K", "V"))
    return b * t * hv * (7 * dk * dv + 2 * dk + 2 * dv)


# The call fla's KDA layer makes (fla/layers/kda.py): raw gate, beta logits, L2 norm in the kernel,
# V-first state; its g and beta are projections in the activation dtype.
MODEL = Variant(gate=Gate.SOFTPLUS, beta_act=BetaAct.SIGMOID, qk_l2norm=True, v_first=True)
PREFILL = ((1, 8192, 32), (4, 4096, 32), (8, 2048, 16), (1, 32768, 16))
# long sequences of few heads: B x H value heads leave most SMs idle for a kernel that walks a sequence in order
LONG_FEW_HEADS = ((1, 65536, 8), (2, 32768, 4))
DECODE_B = (1, 16, 64, 256)


def matrix() -> list[Cell]:
    """The op's matrix, bf16, K = V = 128: fla's chunk_kda prefill shapes and fused_recurrent_kda
    decode (T = 1, H = 32) in fla's default call (fp32 log-space g, post-sigmoid beta, K-first fp32
    state), as fla was measured; and a varlen batch of 8 sequences, 8192 tokens, H = 32 in the
    model's call (MODEL), which puts every fused feature on the benchmark."""
    return prefill_matrix() + varlen_matrix() + decode_matrix()


def varlen_matrix() -> list[Cell]:
    """The matrix's varlen batch in the model's call (8 sequences, 8192 tokens, H = 32, bf16 g, MODEL):
    the named matrix "varlen"."""
    return [cell(DType.BF16, 1, 8192, 32, n=8, g=DType.BF16, variant=MODEL)]


def prefill_matrix() -> list[Cell]:
    """The prefill cells of the matrix (PREFILL shapes in fla's default call): the named matrix "prefill"."""
    return [cell(DType.BF16, b, t, h) for b, t, h in PREFILL]


def long_matrix() -> list[Cell]:
    """Long sequences of few heads (LONG_FEW_HEADS in fla's default call): the named matrix "long"."""
    return [cell(DType.BF16, b, t, h) for b, t, h in LONG_FEW_HEADS]


def decode_matrix() -> list[Cell]:
    """The decode cells of the matrix (T = 1, H = 32, B in DECODE_B): the named matrix "decode"."""
    return [cell(DType.BF16, b, 1, 32) for b in DECODE_B]


def edge_cells() -> list[Cell]:
    """Tiny shapes over every variant: T = 1 and 3, H = 1, K = V = 16, K != V, grouped value heads,
    varlen with a length-1 sequence, T crossing a 64-token chunk, bf16 states, fp16 and fp32."""
    bf = DType.BF16
    return [
        cell(bf, 1, 1, 1, 16, 16),
        cell(bf, 2, 3, 1, 16, 16),
        cell(bf, 1, 7, 2, 16, 16, n=3),
        cell(bf, 2, 5, 2, 32, 16, hv=4, variant=Variant(v_first=True)),
        cell(bf, 1, 65, 1, 16, 16, g=bf, variant=Variant(Gate.SOFTPLUS, BetaAct.SIGMOID, qk_l2norm=True)),
        cell(bf, 1, 130, 2, 16, 16, n=4, hv=4, g=bf, variant=Variant(Gate.LOWER_BOUND, BetaAct.SIGMOID2, True, True)),
        cell(bf, 1, 300, 1, 16, 16, n=3, variant=Variant(qk_l2norm=True)),
        cell(bf, 3, 4, 1, 16, 32, state=bf),
        cell(bf, 2, 1, 2, 16, 16, hv=4, g=bf, state=bf, variant=MODEL),
        cell(DType.FP16, 2, 3, 1, 16, 16),
        cell(DType.FP32, 1, 7, 2, 16, 16, n=2, variant=Variant(Gate.SOFTPLUS)),
    ]


# The gate's input kinds, filled on the device (evo.core.spec.FillSpec), one set for every cell. They mirror
# make_inputs for fla's default call (log-space g, post-sigmoid beta, no in-kernel norm); a cell of
# another variant gets the same values, still finite and mild (a raw gate reads the negative g as
# its input; beta logits lie in (0, 1)), so its kernels are checked, less sharply than by make_inputs.
# q, k are unit rows except under no_state, where rows of norm ~0.04 sqrt(K) (0.45 at K = 128) are
# stable without a norm and make a kernel that skips the in-kernel L2 norm wrong by 2-6x. The
# initial state's entries are ~128^-1/2 for every K, beta_large's logits are +-40 + N(0, 30^2)
# (9 in 10 past +-8, make_inputs' smallest), and no_state's initial state is zeros (a plan always
# binds it). A varlen cell's cu_seqlens gets uneven lengths under every kind, as in make_inputs.
_UNIT_ROWS = FillSpec(transform="l2norm_rows")
# log(-g) ~ N(mean, std); gate_at_bound: -g within about 0.1% of -LOWER_BOUND = 5; decay_at_factor_limit: -g within
# about 1% of FACTOR_LIMIT_DECAY
_LOG_DECAY = {"normal": (-2.0, 1.0), "decay_near_one": (-8.0, 1.0), "decay_near_zero": (2.5, 0.5),
              "gate_at_bound": (math.log(-LOWER_BOUND) - 5e-4, 2e-4),
              "decay_at_factor_limit": (math.log(FACTOR_LIMIT_DECAY), 0.01)}


def _fills(kind: str) -> dict[str, FillSpec]:
    mean, std = _LOG_DECAY.get(kind, _LOG_DECAY["normal"])
    qk = FillSpec(std=0.04) if kind == "no_state" else _UNIT_ROWS
    beta = FillSpec(std=30.0, row_shift=40.0, transform="sigmoid") if kind == "beta_large" else FillSpec(transform="sigmoid")
    return {
        "q": qk, "k": qk, "v": FillSpec(),
        "g": FillSpec(mean=mean, std=std, transform="neg_exp"),
        "beta": beta,
        "initial_state": FillSpec(mean=0.0, std=0.0) if kind == "no_state" else FillSpec(std=128 ** -0.5),
        # raw gates only: fla's layer init, A_log = log U(1, 16) and dt = softplus(dt_bias) in [1e-3, 0.1]
        "A_log": FillSpec(mean=1.96, std=0.7),
        "dt_bias": FillSpec(mean=-4.6, std=1.3),
        "cu_seqlens": FillSpec(offsets="T"),
    }


FILLS = {kind: _fills(kind) for kind in INPUT_KINDS if kind != "varlen"}


def gate_cells(c: Cell) -> list[Cell]:
    """Same dtypes, variant, K and V, few heads: one sequence of one token, an odd batch, a short
    multi-token batch (T = 3), and for a varlen cell a varlen batch with a length-1 sequence."""
    var = variant_of(c)
    h = min(c.dim("H"), 2)
    hv = h * (c.dim("HV") // c.dim("H"))
    def make(b: int, t: int, n: int | None = None) -> Cell:
        return cell(c.dtype("x"), b, t, h, c.dim("K"), c.dim("V"), n, hv, g=c.dtype("g"), state=c.dtype("state"),
                    variant=var)

    out = [make(1, 7, 3)] if is_varlen(c) else [make(1, 1), make(3, 1), make(2, 3)]
    return [g for g in out if g != c]


HEAD_RATIOS = (1, 2, 3, 4)  # value heads per qk head a drawn gate cell may group
HEADS = (1, 2, 3)  # qk heads of a drawn gate cell


def token_shapes(c: Cell, rng: random.Random, tile: Callable[[str], int]) -> list[Cell]:
    """The gate's check cells drawn per job: same dtypes, variant, K and V, one to three qk heads (drawn). One
    token of one sequence; an odd batch of one token; a short run and a long one (several chunks, or for a
    one-token-chunk template 48 to 80 tokens: with decay_near_one the state carries every step) at residues
    mod the template's chunk (tile("T")) that differ, none a power of two; all but the first with value heads
    grouped by a drawn ratio, the last with at least two qk heads of at least two value heads each (a kernel
    that maps value heads to qk heads wrongly is wrong there). A varlen cell gets varlen batches of a drawn number
    of sequences instead (their lengths are drawn by the fill)."""
    var = variant_of(c)
    h = rng.choice(HEADS)

    def make(b: int, t: int, ratio: int, n: int | None = None, heads: int = 0) -> Cell:
        qk = heads or h
        return cell(c.dtype("x"), b, t, qk, c.dim("K"), c.dim("V"), n, qk * ratio, g=c.dtype("g"),
                    state=c.dtype("state"), variant=var)

    chunk = tile("T")
    short, long = draw_lengths(rng, chunk, [(2, max(15, chunk - 1)), (max(48, chunk + 1), max(80, 3 * chunk - 1))])
    ratios = [rng.choice(HEAD_RATIOS) for _ in range(2)] + [rng.choice([r for r in HEAD_RATIOS if r > 1])]
    grouped = rng.choice([x for x in HEADS if x > 1])
    own = c.dim("HV") // c.dim("H")
    if is_varlen(c):
        out = [make(1, short, ratios[0], min(short, rng.randint(2, 4))),
               make(1, long, ratios[2], rng.randint(2, 5), heads=grouped)]
    else:
        out = [make(1, 1, own), make(rng.choice((3, 5, 7)), 1, ratios[0]), make(2, short, ratios[1]),
               make(1, long, ratios[2], heads=grouped)]
    return list(dict.fromkeys(g for g in out if g != c))


def decode_loop(c: Cell, steps: int) -> tuple[Cell, Cell] | None:
    """A decode cell's loop (T = 1, equal lengths, fp32 state): one sequence of one token, and the same
    sequence of `steps` tokens, with the cell's dtypes, variant, K, V and at most two qk heads. A bf16
    state is rounded at every call by its contract, which a float64 reference over the whole loop is not:
    no loop there."""
    if c.dim("T") != 1 or is_varlen(c) or c.dtype("state") is not DType.FP32:
        return None
    h = min(c.dim("H"), 2)
    hv = h * (c.dim("HV") // c.dim("H"))

    def make(t: int) -> Cell:
        return cell(c.dtype("x"), 1, t, h, c.dim("K"), c.dim("V"), None, hv, g=c.dtype("g"), state=c.dtype("state"),
                    variant=variant_of(c))

    return make(1), make(steps)


def _default_scale(c: Cell) -> float:
    return c.dim("K") ** -0.5


def _variant_scalar(name: str) -> ScalarSpec:
    return ScalarSpec(name, int, lambda c: c.dim(name))


SPEC = OpSpec(
    name="kda",
    tensors=(
        TensorSpec("q", ("B", "T", "H", "K"), "x"),
        TensorSpec("k", ("B", "T", "H", "K"), "x"),
        TensorSpec("v", ("B", "T", "HV", "V"), "x"),
        TensorSpec("g", ("B", "T", "HV", "K"), "g"),
        TensorSpec("beta", ("B", "T", "HV"), "x"),
        # bound on raw-gate cells (a plan's "A_log?", "dt_bias?" args; a null pointer on log-space ones)
        TensorSpec("A_log", ("HV",), DType.FP32, optional=True, used_when=raw_gate),
        TensorSpec("dt_bias", ("HV", "K"), DType.FP32, optional=True, used_when=raw_gate),
        TensorSpec("initial_state", ("N", "HV", "SR", "SC"), "state", optional=True, used_when=has_state),
        # bound on varlen cells (a plan's "cu_seqlens?" arg; a null pointer on the others)
        TensorSpec("cu_seqlens", ("Ncu",), DType.INT32, optional=True, used_when=is_varlen),
        TensorSpec("o", ("B", "T", "HV", "V"), "x", role=Role.OUT),
        TensorSpec("final_state", ("N", "HV", "SR", "SC"), "state", role=Role.OUT, optional=True,
                   used_when=has_state),
    ),
    scalars=(
        # drawn for the gate's check cells: a caller may pass any scale, and any lower bound in fla's safe range
        ScalarSpec("scale", float, _default_scale, draw=log_uniform(0.5, 2.0, _default_scale)),
        ScalarSpec("lower_bound", float, LOWER_BOUND, draw=uniform(LOWER_BOUND, -1.0)),
        *(_variant_scalar(d) for d in VARIANT_DIMS),
    ),
    dtype_roles=("x", "g", "state"),
    reference=kda_fwd,
    make_inputs=make_inputs,
    input_kinds=INPUT_KINDS,
    tolerance=tolerance,
    bytes_moved=bytes_moved,
    matrix=matrix,
    edge_cells=edge_cells,
    flops=flops,
    fills=FILLS,
    timing_kinds=("normal",),
    gate_cells=gate_cells,
    gate_shapes=token_shapes,
    # decays near 1: the state carries nearly all of every earlier token, so an error a call leaves in it
    # (below one call's tolerance) adds up over the loop
    recurrence=Recurrence("T", "initial_state", "final_state", decode_loop, kind="decay_near_one"),
    causal=Causal("T"),
    # fla's decode kernel first (the peer a decode search times by default); chunk_kda for prefill
    baselines=("fla.fused_recurrent_kda", "fla.chunk_kda"),
    bucket_edges={"B": (4, 64), "T": (64, 4096)},
    matrices={"decode": decode_matrix, "prefill": prefill_matrix, "varlen": varlen_matrix, "long": long_matrix},
)
