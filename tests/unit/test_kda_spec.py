"""KDA forward spec: the float64 reference against independent formulations, and the spec's data."""

from __future__ import annotations

import numpy as np
import pytest

from ops.kda import SPEC
from ops.kda.spec import cell, io_bytes, is_varlen, kinds_for
from ops.spec import Cell, DType, quantize

SMALL = [(1, 1, 1, 4, 4), (1, 5, 2, 4, 6), (2, 7, 3, 8, 4), (3, 9, 1, 6, 6)]


def random_inputs(rng: np.random.Generator, b: int, t: int, h: int, dk: int, dv: int) -> dict[str, np.ndarray]:
    """Unrounded float64 inputs in the ranges the op sees."""
    q = rng.standard_normal((b, t, h, dk))
    k = rng.standard_normal((b, t, h, dk))
    return {
        "q": q,
        "k": k / np.linalg.norm(k, axis=-1, keepdims=True),
        "v": rng.standard_normal((b, t, h, dv)),
        "g": -rng.exponential(0.3, (b, t, h, dk)),
        "beta": rng.uniform(0.05, 1.0, (b, t, h)),
    }


def sequences(inputs: dict[str, np.ndarray]) -> list[tuple[int, int, int]]:
    """(batch row, start, end) of every sequence."""
    b, t = inputs["q"].shape[:2]
    cu = inputs.get("cu_seqlens")
    if cu is None:
        return [(i, 0, t) for i in range(b)]
    return [(0, int(cu[i]), int(cu[i + 1])) for i in range(len(cu) - 1)]


def scalar_loop_kda(inputs: dict[str, np.ndarray], scale: float) -> dict[str, np.ndarray]:
    """The recurrence written out one element at a time, per (sequence, head)."""
    q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
    h, dk, dv = q.shape[2], q.shape[3], v.shape[3]
    seqs = sequences(inputs)
    o = np.zeros(v.shape)
    final = np.zeros((len(seqs), h, dk, dv))
    for n, (b, lo, hi) in enumerate(seqs):
        for hh in range(h):
            s = [[0.0] * dv for _ in range(dk)]
            if "initial_state" in inputs:
                s = [[float(inputs["initial_state"][n, hh, i, j]) for j in range(dv)] for i in range(dk)]
            for t in range(lo, hi):
                for i in range(dk):
                    decay = np.exp(g[b, t, hh, i])
                    for j in range(dv):
                        s[i][j] *= decay
                for j in range(dv):
                    pred = sum(k[b, t, hh, i] * s[i][j] for i in range(dk))
                    err = v[b, t, hh, j] - pred
                    for i in range(dk):
                        s[i][j] += beta[b, t, hh] * k[b, t, hh, i] * err
                for j in range(dv):
                    o[b, t, hh, j] = sum(scale * q[b, t, hh, i] * s[i][j] for i in range(dk))
            final[n, hh] = s
    return {"o": o, "final_state": final}


def chunked_kda(inputs: dict[str, np.ndarray], scale: float, chunk: int) -> dict[str, np.ndarray]:
    """The chunked (UT / WY) form that fast kernels use: per chunk, solve a unit lower-triangular
    system for the deltas, then read outputs and the next state with matrix products."""
    q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
    h, dk, dv = q.shape[2], q.shape[3], v.shape[3]
    seqs = sequences(inputs)
    o = np.zeros(v.shape)
    final = np.zeros((len(seqs), h, dk, dv))
    for n, (b, lo, hi) in enumerate(seqs):
        for hh in range(h):
            s = inputs["initial_state"][n, hh].copy() if "initial_state" in inputs else np.zeros((dk, dv))
            for c0 in range(lo, hi, chunk):
                sl = slice(c0, min(c0 + chunk, hi))
                qc, kc, vc, bc = q[b, sl, hh], k[b, sl, hh], v[b, sl, hh], beta[b, sl, hh]
                cum = np.cumsum(g[b, sl, hh], axis=0)  # [C, K] decay from the chunk start
                rel = np.exp(cum[:, None, :] - cum[None, :, :])  # [r, i, K] decay from i to r
                a_kk = np.tril(np.einsum("rc,ic,ric->ri", kc, kc, rel), -1)
                a_qk = np.tril(np.einsum("rc,ic,ric->ri", qc, kc, rel))
                lhs = np.eye(len(bc)) + bc[:, None] * a_kk
                delta = np.linalg.solve(lhs, bc[:, None] * (vc - (kc * np.exp(cum)) @ s))
                o[b, sl, hh] = scale * ((qc * np.exp(cum)) @ s + a_qk @ delta)
                s = np.exp(cum[-1])[:, None] * s + (kc * np.exp(cum[-1] - cum)).T @ delta
            final[n, hh] = s
    return {"o": o, "final_state": final}


def split_varlen(inputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """One B = 1 input set per sequence of a variable-length batch."""
    parts = []
    for n, (_, lo, hi) in enumerate(sequences(inputs)):
        part = {name: inputs[name][:, lo:hi] for name in ("q", "k", "v", "g", "beta")}
        if "initial_state" in inputs:
            part["initial_state"] = inputs["initial_state"][n : n + 1]
        parts.append(part)
    return parts


def assert_outputs_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], rtol: float = 1e-10) -> None:
    for name in ("o", "final_state"):
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("b,t,h,dk,dv", SMALL, ids=[f"B{b}-T{t}-H{h}-K{k}-V{v}" for b, t, h, k, v in SMALL])
def test_reference_matches_scalar_loop(b: int, t: int, h: int, dk: int, dv: int, with_state: bool) -> None:
    rng = np.random.default_rng(b * 1000 + t)
    inputs = random_inputs(rng, b, t, h, dk, dv)
    if with_state:
        inputs["initial_state"] = rng.standard_normal((b, h, dk, dv))
    assert_outputs_close(SPEC.reference(inputs, {"scale": 0.7}), scalar_loop_kda(inputs, 0.7))


@pytest.mark.parametrize("chunk", [1, 4, 16])
@pytest.mark.parametrize("kind", ["normal", "long_decay", "varlen"])
def test_reference_matches_chunked_form(kind: str, chunk: int) -> None:
    c = cell(DType.FP32, 1, 21, 2, 8, 6, n=3) if kind == "varlen" else cell(DType.FP32, 2, 21, 2, 8, 6)
    inputs = SPEC.make_inputs(c, kind, np.random.default_rng(chunk))
    scale = SPEC.scalar_values(c)["scale"]
    assert_outputs_close(SPEC.reference(inputs, {"scale": scale}), chunked_kda(inputs, scale, chunk), rtol=1e-9)


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
def test_varlen_equals_separate_sequences(with_state: bool) -> None:
    c = cell(DType.BF16, 1, 40, 3, 16, 8, n=5)
    inputs = SPEC.make_inputs(c, "varlen", np.random.default_rng(3))
    if not with_state:
        del inputs["initial_state"]
    whole = SPEC.reference(inputs, {})
    for n, ((_, lo, hi), part) in enumerate(zip(sequences(inputs), split_varlen(inputs))):
        alone = SPEC.reference(part, {})
        np.testing.assert_allclose(whole["o"][:, lo:hi], alone["o"], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(whole["final_state"][n], alone["final_state"][0], rtol=1e-12, atol=1e-14)


def test_varlen_state_does_not_leak_between_sequences() -> None:
    """Changing one sequence's tokens leaves every other sequence's outputs unchanged."""
    c = cell(DType.FP32, 1, 12, 1, 4, 4, n=3)
    inputs = SPEC.make_inputs(c, "varlen", np.random.default_rng(5))
    lo, hi = sequences(inputs)[1][1:]
    changed = {**inputs, "v": inputs["v"].copy()}
    changed["v"][:, lo:hi] += 1.0
    a, b = SPEC.reference(inputs, {}), SPEC.reference(changed, {})
    rest = np.r_[0:lo, hi:12]
    np.testing.assert_array_equal(a["o"][:, rest], b["o"][:, rest])
    assert not np.allclose(a["o"][:, lo:hi], b["o"][:, lo:hi])
    np.testing.assert_array_equal(a["final_state"][[0, 2]], b["final_state"][[0, 2]])


def test_delta_rule_closed_form_with_orthonormal_keys() -> None:
    """g = 0, beta = 1, keys an orthonormal basis: each step overwrites the value stored under its
    key, so S_t = (I - P_t) S_0 + sum_{i<=t} k_i v_i^T (P_t projects on k_1..k_t); a query equal to
    an earlier key reads back scale * its value, and after K steps S_0 is gone: S_T = K^T V."""
    d = 8
    rng = np.random.default_rng(11)
    basis = np.linalg.qr(rng.standard_normal((d, d)))[0].T  # rows orthonormal
    v = rng.standard_normal((d, d))
    s0 = rng.standard_normal((d, d))
    query_of = [t // 2 for t in range(d)]  # step t asks for the key written at step t // 2
    inputs = {
        "q": basis[query_of][None, :, None, :],
        "k": basis[None, :, None, :],
        "v": v[None, :, None, :],
        "g": np.zeros((1, d, 1, d)),
        "beta": np.ones((1, d, 1)),
        "initial_state": s0[None, None],
    }
    out = SPEC.reference(inputs, {"scale": 0.5})
    np.testing.assert_allclose(out["o"][0, :, 0], 0.5 * v[query_of], atol=1e-12)
    np.testing.assert_allclose(out["final_state"][0, 0], basis.T @ v, atol=1e-12)
    half = d // 2
    inputs_half = {n: a[:, :half] if n != "initial_state" else a for n, a in inputs.items()}
    p = basis[:half].T @ basis[:half]
    want = (np.eye(d) - p) @ s0 + basis[:half].T @ v[:half]
    np.testing.assert_allclose(SPEC.reference(inputs_half, {"scale": 0.5})["final_state"][0, 0], want, atol=1e-12)


def test_scale_defaults_to_k_to_the_minus_half() -> None:
    c = cell(DType.BF16, 1, 6, 2, 16, 8)
    assert SPEC.scalar_values(c)["scale"] == 16**-0.5
    inputs = SPEC.make_inputs(c, "normal", np.random.default_rng(0))
    default = SPEC.reference(inputs, {})
    explicit = SPEC.reference(inputs, {"scale": 0.25})
    doubled = SPEC.reference(inputs, {"scale": 0.5})
    np.testing.assert_array_equal(default["o"], explicit["o"])
    np.testing.assert_allclose(doubled["o"], 2 * explicit["o"], rtol=1e-14)
    np.testing.assert_array_equal(doubled["final_state"], explicit["final_state"])


def _bad(name: str) -> tuple[dict[str, np.ndarray], str]:
    """Consistent B=1 inputs with one tensor made wrong; returns them and the tensor's name."""
    inputs = random_inputs(np.random.default_rng(0), 1, 5, 2, 4, 3)
    if name == "k":
        inputs["k"] = inputs["k"][:, :, :, :3]
    elif name == "v":
        inputs["v"] = inputs["v"][:, :4]
    elif name == "g":
        inputs["g"] = inputs["g"][:, :, :1]
    elif name == "beta":
        inputs["beta"] = inputs["beta"][..., None]
    elif name == "initial_state":
        inputs["initial_state"] = np.zeros((1, 2, 3, 4))
    elif name == "cu_seqlens":
        inputs["cu_seqlens"] = np.array([0, 2, 4])  # ends before T = 5
    elif name == "q":
        inputs["q"] = inputs["q"][0]
    return inputs, name


@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta", "initial_state", "cu_seqlens"])
def test_bad_shapes_raise_naming_the_tensor(name: str) -> None:
    inputs, name = _bad(name)
    with pytest.raises(ValueError, match=rf"^kda: {name} "):
        SPEC.reference(inputs, {})


def test_bad_shape_message_gives_both_shapes() -> None:
    inputs = random_inputs(np.random.default_rng(0), 1, 5, 2, 4, 3)
    inputs["g"] = np.zeros((1, 5, 2, 3))
    with pytest.raises(ValueError, match=r"g has shape \(1, 5, 2, 3\), expected \(1, 5, 2, 4\)"):
        SPEC.reference(inputs, {})


def test_cu_seqlens_needs_batch_of_one() -> None:
    inputs = random_inputs(np.random.default_rng(0), 2, 4, 1, 4, 4)
    inputs["cu_seqlens"] = np.array([0, 1, 4])
    with pytest.raises(ValueError, match="cu_seqlens"):
        SPEC.reference(inputs, {})


def test_initial_state_needs_one_per_sequence() -> None:
    inputs = random_inputs(np.random.default_rng(0), 1, 6, 1, 4, 4)
    inputs["cu_seqlens"] = np.array([0, 1, 4, 6])
    inputs["initial_state"] = np.zeros((1, 1, 4, 4))  # one state, three sequences
    with pytest.raises(ValueError, match=r"initial_state has shape \(1, 1, 4, 4\), expected \(3, 1, 4, 4\)"):
        SPEC.reference(inputs, {})


def _cases() -> list[tuple[Cell, str]]:
    return [(c, k) for c in SPEC.edge_cells() for k in kinds_for(c)]


@pytest.mark.parametrize("c,kind", _cases(), ids=[f"{c.label()}-{k}" for c, k in _cases()])
def test_inputs_match_the_signature_and_dtypes(c: Cell, kind: str) -> None:
    inputs = SPEC.make_inputs(c, kind, np.random.default_rng(0))
    for t in SPEC.inputs():
        if t.optional and t.name not in inputs:
            continue
        a = inputs[t.name]
        assert a.shape == t.shape(c), t.name
        np.testing.assert_array_equal(quantize(a, t.resolve_dtype(c)), a, err_msg=t.name)
    assert set(inputs) <= {t.name for t in SPEC.inputs()}
    assert ("cu_seqlens" in inputs) == (kind == "varlen" or is_varlen(c))
    assert ("initial_state" in inputs) == (kind != "normal")
    out = SPEC.reference(inputs, SPEC.scalar_values(c))
    for t in SPEC.outputs():
        assert out[t.name].shape == t.shape(c), t.name
        assert np.all(np.isfinite(out[t.name])), t.name


@pytest.mark.parametrize("kind", ["normal", "long_decay", "varlen"])
def test_input_value_ranges(kind: str) -> None:
    c = cell(DType.FP32, 1, 64, 4, 32, 32, n=4)
    inputs = SPEC.make_inputs(c, kind, np.random.default_rng(1))
    np.testing.assert_allclose(np.linalg.norm(inputs["q"], axis=-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(inputs["k"], axis=-1), 1.0, rtol=1e-6)
    decay = np.exp(inputs["g"])
    assert np.all((decay > 0) & (decay < 1))
    assert np.all((inputs["beta"] > 0) & (inputs["beta"] < 1))
    if kind == "long_decay":
        assert np.median(decay) > 0.999
    else:
        assert 0.8 < np.median(decay) < 0.95


def test_varlen_kind_has_uneven_lengths_with_a_single_token_sequence() -> None:
    c = cell(DType.BF16, 1, 200, 1, 16, 16, n=6)
    for seed in range(5):
        cu = SPEC.make_inputs(c, "varlen", np.random.default_rng(seed))["cu_seqlens"]
        lengths = np.diff(cu)
        assert cu[0] == 0 and cu[-1] == 200 and len(cu) == 7
        assert lengths.min() == 1 and len(set(lengths.tolist())) > 2


def test_varlen_kind_refuses_a_batch() -> None:
    with pytest.raises(ValueError, match="B = 1"):
        SPEC.make_inputs(cell(DType.BF16, 2, 4, 1, 16, 16), "varlen", np.random.default_rng(0))
    assert "varlen" not in kinds_for(cell(DType.BF16, 2, 4, 1, 16, 16))


def test_cell_refuses_several_sequences_in_a_batch() -> None:
    with pytest.raises(ValueError, match="B = 1"):
        cell(DType.BF16, 2, 8, 1, n=3)
    with pytest.raises(ValueError, match="N <= T"):
        cell(DType.BF16, 1, 2, 1, n=3)


def test_matrix_is_flas_benchmark() -> None:
    got = {(c.dim("B"), c.dim("T"), c.dim("H"), c.dim("K"), c.dim("V"), c.dtype("x")) for c in SPEC.matrix()}
    want = {(1, 8192, 32), (4, 4096, 32), (8, 2048, 16), (1, 32768, 16)}
    assert got == {(b, t, h, 128, 128, DType.BF16) for b, t, h in want}
    assert all(c.dim("N") == c.dim("B") for c in SPEC.matrix())


def test_edge_cells_cover_tiny_and_varlen_shapes() -> None:
    cells = SPEC.edge_cells()
    dims = [c.dims_dict() for c in cells]
    assert any(d["T"] == 1 for d in dims) and any(d["T"] == 3 for d in dims)
    assert any(d["H"] == 1 for d in dims)
    assert any(d["K"] == d["V"] == 16 for d in dims)
    assert any(d["K"] != d["V"] for d in dims)
    assert any(is_varlen(c) for c in cells)
    assert all(c.dim("Ncu") == c.dim("N") + 1 for c in cells)


def test_bytes_moved_hand_count() -> None:
    c = cell(DType.BF16, 2, 10, 3, 16, 8)
    tokens = 2 * 10 * 3
    hand = tokens * (16 * 2 + 16 * 2 + 8 * 2 + 16 * 4 + 2)  # q, k, v, g (fp32), beta
    hand += tokens * 8 * 2  # o
    hand += 2 * 2 * 3 * 16 * 8 * 4  # initial and final state, fp32
    assert SPEC.bytes_moved(c) == hand
    assert io_bytes(c, initial_state=False, final_state=False, cu_seqlens=False) == hand - 2 * 3 * 16 * 8 * 4 * 2
    varlen = cell(DType.BF16, 1, 10, 3, 16, 8, n=4)
    no_cu = io_bytes(varlen, initial_state=True, final_state=True, cu_seqlens=False)
    assert SPEC.bytes_moved(varlen) == no_cu + 5 * 4


def test_flops_and_tolerances_are_ordered() -> None:
    c = cell(DType.BF16, 1, 8, 2, 16, 16)
    assert SPEC.flops(c) == 8 * 2 * (7 * 16 * 16 + 4 * 16)
    for out in ("o", "final_state"):
        tols = [SPEC.tolerance(cell(d, 1, 8, 2, 16, 16), out) for d in (DType.FP32, DType.FP16, DType.BF16)]
        assert tols[0].rel_norm < tols[1].rel_norm < tols[2].rel_norm
        assert tols[0].atol <= tols[1].atol <= tols[2].atol
    with pytest.raises(KeyError, match="nope"):
        SPEC.tolerance(c, "nope")
