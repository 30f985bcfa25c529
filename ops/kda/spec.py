"""Kimi Delta Attention forward: signature, matrix, inputs, tolerances, bytes.

Dtypes: one role "x" covers q, k, v, beta and o, as fla's `chunk_kda` callers pass them (all in the
model's activation dtype, o in v's dtype). g is fixed fp32: it is a log-space decay summed over up
to T tokens by chunked kernels, and bf16 (8 mantissa bits) would turn small decays near 0 into
visible error in exp(cumsum(g)). The states are fixed fp32 as in fla: they accumulate over the
whole sequence.

Dims: B, T, H, K, V as in fla; N is the number of sequences (N = B for a batch of equal lengths;
B = 1 and N > 1 for a variable-length batch) and Ncu = N + 1 is the length of cu_seqlens (a
TensorSpec dim is a name, not an expression, so the cell carries it; `cell()` keeps it consistent).
"""

from __future__ import annotations

import numpy as np

from ops.kda.reference import kda_fwd
from ops.spec import Cell, DType, OpSpec, Role, ScalarSpec, TensorSpec, Tolerance, quantize

INPUT_KINDS = ("normal", "long_decay", "varlen")

# First estimates, to recalibrate against a real kernel. A float32 recurrence that rounds the state,
# S^T k and q to the x dtype (where a chunked tensor-core kernel rounds) stays 3-5x inside them on
# every input kind. Entries of o are ~0.1, of the state ~1, hence the different atol.
TOLERANCES = {
    DType.FP32: Tolerance(atol=1e-4, rtol=1e-4, rel_norm=5e-5),
    DType.FP16: Tolerance(atol=1e-3, rtol=5e-3, rel_norm=2e-3),
    DType.BF16: Tolerance(atol=4e-3, rtol=2e-2, rel_norm=8e-3),
}

STATE_TOLERANCES = {
    DType.FP32: Tolerance(atol=1e-4, rtol=1e-4, rel_norm=5e-5),
    DType.FP16: Tolerance(atol=2e-3, rtol=5e-3, rel_norm=2e-3),
    DType.BF16: Tolerance(atol=1.5e-2, rtol=2e-2, rel_norm=8e-3),
}


def cell(dtype: DType | str, b: int, t: int, h: int, k: int = 128, v: int = 128, n: int | None = None) -> Cell:
    """A cell; n (sequences) defaults to b, and n != b makes a variable-length batch (needs b = 1)."""
    n = b if n is None else n
    if n != b and not (b == 1 and 1 <= n <= t):
        raise ValueError(f"kda cell: N = {n} sequences needs B = 1 and N <= T, got B = {b}, T = {t}")
    return Cell.make({"x": dtype}, {"B": b, "T": t, "H": h, "K": k, "V": v, "N": n, "Ncu": n + 1})


def is_varlen(cell: Cell) -> bool:
    """Whether the cell packs several sequences into B = 1 (so cu_seqlens is always present)."""
    return cell.dim("N") != cell.dim("B")


def kinds_for(cell: Cell) -> tuple[str, ...]:
    """The input kinds that fit the cell: "varlen" needs B = 1."""
    return INPUT_KINDS if cell.dim("B") == 1 else tuple(k for k in INPUT_KINDS if k != "varlen")


def make_inputs(cell: Cell, kind: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Float64 arrays already rounded to the cell's dtypes (cu_seqlens as integers).

    normal: q, k L2-normalized per head (as fla's callers do), v ~ N(0, 1),
        g = -exp(N(-2, 0.5)) so exp(g) is near 0.87, beta = sigmoid(N(0, 1)); no initial_state.
    long_decay: as normal but g = -exp(N(-8, 1)), so exp(g) is within ~1e-3 of 1 and the state
        remembers the whole sequence, plus an initial_state that a kernel must not drop.
    varlen: as normal, with cu_seqlens of uneven lengths (one of length 1) and an initial_state
        per sequence, so indexing states by batch instead of sequence fails. Needs B = 1.
    A varlen cell (N != B) gets cu_seqlens under every kind.
    """
    if kind not in INPUT_KINDS:
        raise ValueError(f"kda has no input kind {kind!r}; expected one of {INPUT_KINDS}")
    if kind == "varlen" and cell.dim("B") != 1:
        raise ValueError(f"kda input kind 'varlen' needs B = 1, cell {cell.label()} has B = {cell.dim('B')}")
    b, t, h, dk, dv, n = (cell.dim(d) for d in ("B", "T", "H", "K", "V", "N"))
    x = cell.dtype("x")

    q = _l2_normalize(rng.standard_normal((b, t, h, dk)))
    k = _l2_normalize(rng.standard_normal((b, t, h, dk)))
    v = rng.standard_normal((b, t, h, dv))
    log_rate = rng.normal(-8.0, 1.0, (b, t, h, dk)) if kind == "long_decay" else rng.normal(-2.0, 0.5, (b, t, h, dk))
    g = -np.exp(log_rate)
    beta = 1.0 / (1.0 + np.exp(-rng.standard_normal((b, t, h))))
    out = {
        "q": quantize(q, x),
        "k": quantize(k, x),
        "v": quantize(v, x),
        "g": quantize(g, DType.FP32),
        "beta": quantize(beta, x),
    }
    if kind != "normal":
        # Columns of a state map unit keys to values of size ~1, so entries are ~K^-1/2.
        out["initial_state"] = quantize(rng.standard_normal((n, h, dk, dv)) / np.sqrt(dk), DType.FP32)
    if kind == "varlen" or is_varlen(cell):
        lengths = _seq_lengths(t, n, rng, with_unit=kind == "varlen")
        out["cu_seqlens"] = quantize(np.concatenate([[0], np.cumsum(lengths)]), DType.INT32)
    return out


def _l2_normalize(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def _seq_lengths(t: int, n: int, rng: np.random.Generator, with_unit: bool) -> np.ndarray:
    """n positive lengths summing to t, uneven; one of them 1 when with_unit and n > 1."""
    if n == 1:
        return np.array([t])
    fixed = 1 if with_unit else 0
    free = n - fixed
    # Squared exponential weights give a few long sequences and several short ones.
    weights = rng.exponential(size=free) ** 2
    lengths = 1 + rng.multinomial(t - n, weights / weights.sum())
    if with_unit:
        lengths = np.insert(lengths, rng.integers(0, n), 1)
    return lengths


def tolerance(cell: Cell, output: str) -> Tolerance:
    """By the cell's x dtype; final_state is fp32 but built from x-dtype inputs and intermediates."""
    if output == "o":
        return TOLERANCES[cell.dtype("x")]
    if output == "final_state":
        return STATE_TOLERANCES[cell.dtype("x")]
    raise KeyError(f"kda has no output {output!r}")


def io_bytes(cell: Cell, initial_state: bool, final_state: bool, cu_seqlens: bool) -> int:
    """Each input read once, each output written once, for the given optional tensors."""
    b, t, h, dk, dv, n = (cell.dim(d) for d in ("B", "T", "H", "K", "V", "N"))
    xb = cell.dtype("x").nbytes
    tokens = b * t * h
    total = tokens * (2 * dk * xb + dv * xb + dk * DType.FP32.nbytes + xb)  # q, k, v, g, beta
    total += tokens * dv * xb  # o
    state = n * h * dk * dv * DType.FP32.nbytes
    total += state * (int(initial_state) + int(final_state))
    total += (n + 1) * DType.INT32.nbytes * int(cu_seqlens)
    return total


def bytes_moved(cell: Cell) -> int:
    """Full I/O: q, k, v, g, beta and initial_state read, o and final_state written, plus cu_seqlens
    for a varlen cell. The states are < 1% of the total on matrix cells."""
    return io_bytes(cell, initial_state=True, final_state=True, cu_seqlens=is_varlen(cell))


def flops(cell: Cell) -> int:
    """The recurrent form per token and head: decay K*V, S^T k 2KV, rank-1 update 2KV, S^T q 2KV,
    plus exp(g), scale*q, v - S^T k and beta*(...) (chunked kernels do more, for the tensor cores)."""
    b, t, h, dk, dv = (cell.dim(d) for d in ("B", "T", "H", "K", "V"))
    return b * t * h * (7 * dk * dv + 2 * dk + 2 * dv)


def matrix() -> list[Cell]:
    """fla's KDA benchmark cases: bf16, K = V = 128."""
    return [
        cell(DType.BF16, 1, 8192, 32),
        cell(DType.BF16, 4, 4096, 32),
        cell(DType.BF16, 8, 2048, 16),
        cell(DType.BF16, 1, 32768, 16),
    ]


def edge_cells() -> list[Cell]:
    """Tiny shapes: T = 1 and 3, H = 1, K = V = 16, varlen with a length-1 sequence, K != V, a T
    that crosses a 64-token chunk, and fp16/fp32."""
    bf = DType.BF16
    return [
        cell(bf, 1, 1, 1, 16, 16),
        cell(bf, 1, 3, 1, 16, 16),
        cell(bf, 2, 3, 1, 16, 16),
        cell(bf, 1, 3, 1, 16, 16, n=2),
        cell(bf, 1, 3, 2, 16, 16, n=3),
        cell(bf, 1, 7, 2, 16, 16, n=3),
        cell(bf, 2, 5, 3, 32, 16),
        cell(bf, 1, 65, 1, 16, 16),
        cell(bf, 1, 130, 2, 16, 16, n=4),
        cell(DType.FP16, 2, 3, 1, 16, 16),
        cell(DType.FP32, 1, 7, 2, 16, 16, n=2),
    ]


SPEC = OpSpec(
    name="kda",
    tensors=(
        TensorSpec("q", ("B", "T", "H", "K"), "x"),
        TensorSpec("k", ("B", "T", "H", "K"), "x"),
        TensorSpec("v", ("B", "T", "H", "V"), "x"),
        TensorSpec("g", ("B", "T", "H", "K"), DType.FP32),
        TensorSpec("beta", ("B", "T", "H"), "x"),
        TensorSpec("initial_state", ("N", "H", "K", "V"), DType.FP32, optional=True),
        TensorSpec("cu_seqlens", ("Ncu",), DType.INT32, optional=True),
        TensorSpec("o", ("B", "T", "H", "V"), "x", role=Role.OUT),
        TensorSpec("final_state", ("N", "H", "K", "V"), DType.FP32, role=Role.OUT, optional=True),
    ),
    scalars=(ScalarSpec("scale", float, lambda c: c.dim("K") ** -0.5),),
    dtype_roles=("x",),
    reference=kda_fwd,
    make_inputs=make_inputs,
    input_kinds=INPUT_KINDS,
    tolerance=tolerance,
    bytes_moved=bytes_moved,
    matrix=matrix,
    edge_cells=edge_cells,
    flops=flops,
)
