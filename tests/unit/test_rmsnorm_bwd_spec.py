"""RMSNorm backward's float64 reference is the gradient of the forward's (central differences), and its
spec fits the op contract with several outputs and a reduction over rows."""

from __future__ import annotations

import numpy as np
import pytest

from ops.rmsnorm.reference import rmsnorm_fwd
from ops.rmsnorm_bwd.spec import DTYPES, SPEC, cell
from evo.core.spec import DType

EPS = 1e-6


def loss(x, w, dy):
    return float(np.sum(dy * rmsnorm_fwd({"x": x, "w": w}, {"eps": EPS})["y"]))


@pytest.mark.parametrize("scale", [1.0, 300.0, 1e-3], ids=["unit", "large", "tiny"])
def test_reference_is_the_gradient_of_the_forward(scale):
    rng = np.random.default_rng(int(scale * 7) + 1)
    x = rng.standard_normal((3, 5)) * scale
    w = 1.0 + 0.1 * rng.standard_normal(5)
    dy = rng.standard_normal((3, 5))
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=1) + EPS)
    got = SPEC.reference({"x": x, "w": w, "dout": dy, "rstd": rstd}, {})
    h = 1e-6 * max(scale, 1e-3)
    num_dx = np.zeros_like(x)
    for i in range(3):
        for j in range(5):
            e = np.zeros_like(x)
            e[i, j] = h
            num_dx[i, j] = (loss(x + e, w, dy) - loss(x - e, w, dy)) / (2 * h)
    num_dw = np.array([(loss(x, w + np.eye(5)[j] * 1e-6, dy) - loss(x, w - np.eye(5)[j] * 1e-6, dy)) / 2e-6
                       for j in range(5)])
    np.testing.assert_allclose(got["dx"], num_dx, rtol=1e-5, atol=1e-6 * np.abs(num_dx).max())
    np.testing.assert_allclose(got["dw"], num_dw, rtol=1e-6, atol=1e-9)


def test_inputs_shapes_and_kinds():
    c = cell(DType.BF16, 6, 64)
    for kind in SPEC.gate_kinds():
        inputs = SPEC.make_inputs(c, kind, np.random.default_rng(0))
        assert inputs["x"].shape == inputs["dout"].shape == (6, 64)
        assert inputs["w"].shape == (64,) and inputs["rstd"].shape == (6,)
        out = SPEC.reference(inputs, {})
        assert out["dx"].shape == (6, 64) and out["dw"].shape == (64,)
        assert np.isfinite(out["dx"]).all() and np.isfinite(out["dw"]).all()
    with pytest.raises(ValueError, match="bogus"):
        SPEC.make_inputs(c, "bogus", np.random.default_rng(0))


def test_dw_tolerance_grows_with_the_rows_it_sums():
    small, big = cell(DType.FP32, 37, 1000), cell(DType.FP32, 32768, 4096)
    assert SPEC.tolerance(big, "dw").atol == pytest.approx(SPEC.tolerance(small, "dw").atol * np.sqrt(32768 / 37))
    assert SPEC.tolerance(big, "dx") == SPEC.tolerance(small, "dx")


def test_matrix_is_the_seven_m_n_pairs_in_three_dtypes():
    dims = {(c.dim("M"), c.dim("N")) for c in SPEC.matrix()}
    assert dims == {(32768, n) for n in (4096, 8192, 16384, 32768, 65536)} | {(16384, 131072), (8192, 262144)}
    by_dtype = {d: {(c.dim("M"), c.dim("N")) for c in SPEC.matrix() if c.dtype("x") is d} for d in DTYPES}
    assert by_dtype[DType.BF16] == by_dtype[DType.FP16] == dims
    assert by_dtype[DType.FP32] == {(m, n) for m, n in dims if m * n <= 1 << 30}


def test_the_train_matrix_is_the_training_steps_shapes_the_backward_matrix_lacks():
    """The package's training step runs the backward at every forward shape: matrix() and the train matrix cover
    them, once each; experiments/rmsnorm_bwd_train.toml searches the train matrix with legal points on every cell."""
    from pathlib import Path

    from evo.core.config import load_config
    from evo.loop.pipeline import cells_for
    from ops.rmsnorm.spec import matrix as forward_matrix
    from ops.rmsnorm_bwd.spec import matrix, matrix_train
    from tests.unit.config_checks import legal_everywhere

    train = matrix_train()
    assert SPEC.matrices["train"] is matrix_train and not set(train) & set(matrix())
    shapes = {(c.dtype("x"), c.dim("M"), c.dim("N")) for c in train + matrix()}
    assert {(c.dtype("x"), c.dim("M"), c.dim("N")) for c in forward_matrix()} <= shapes
    assert len(train) == 24
    c = load_config(Path(__file__).resolve().parents[2] / "experiments" / "rmsnorm_bwd_train.toml")
    cells = cells_for(c, SPEC)
    assert [x.label() for x in cells] == [x.label() for x in train]
    legal_everywhere(c, cells, tries=500)
