"""On a GPU: RMSNorm's float64 device reference for the variants (residual/residual_out, bias, rstd,
out_dtype, fp32 residual stream, fp32 weight) agrees with the numpy reference on every input kind, and
writes NaN when a candidate's launch plan binds other tensors than the cell's variant has."""

import numpy as np
import pytest

from ops.rmsnorm import device
from ops.rmsnorm.spec import VARIANT_SPEC, matrix_residual, variant_edge_cells, variant_of
from evo.core.spec import Cell, DType, Role, from_device_bytes

RAW = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
NULL = type("Null", (), {"ptr": 0, "nbytes": 0})()
CELLS = variant_edge_cells() + [Cell.make(c.dtypes_dict(), c.dims_dict() | {"M": 5}) for c in matrix_residual()[-2:]]


@pytest.fixture(scope="module")
def worker():
    from evo.measure.worker import Worker

    return Worker()


def uses(c: Cell) -> set[str]:
    """The tensors a cell's variant binds."""
    var = variant_of(c)
    return ({"x", "w", "y"} | ({"residual", "residual_out"} if var.residual else set())
            | ({"bias"} if var.bias else set()) | ({"rstd"} if var.store_rstd else set()))


def run_reference(worker, c: Cell, kind: str, bound: set[str]) -> tuple[dict, dict]:
    """Fill the bound inputs, run the device reference; host inputs and float64 references by name."""
    _, ref_obj = worker._op("rmsnorm")
    bufs, host, alloc = {}, {}, []
    for i, t in enumerate(VARIANT_SPEC.tensors):
        if t.role is not Role.IN:
            continue
        if t.name not in bound:
            bufs[t.name] = NULL
            continue
        dt, shape = t.resolve_dtype(c).value, t.shape(c)
        n = int(np.prod(shape))
        bufs[t.name] = b = worker.alloc(n * DType(dt).nbytes)
        alloc.append(b)
        worker.fill(b, dt, n, shape[-1], VARIANT_SPEC.fills[kind][t.name].bind(c.dims_dict()), seed=11 + i)
    for t in VARIANT_SPEC.outputs():
        if t.name in bound:
            bufs[f"ref:{t.name}"] = b = worker.alloc(int(np.prod(t.shape(c))) * 8)
            alloc.append(b)
        else:
            bufs[f"ref:{t.name}"] = NULL
    for kernel, grid, block, args in device.reference(c.dims_dict(), c.dtypes_dict(), VARIANT_SPEC.scalar_values(c)):
        worker.launch(ref_obj, kernel, grid, block, 0, tuple(("ptr", bufs[v].ptr) if k == "buf" else (k, v)
                                                             for k, v in args))
    worker.sync("reference")
    for t in VARIANT_SPEC.inputs():
        if t.name in bound:
            dt = t.resolve_dtype(c).value
            raw = worker.to_host(bufs[t.name].ptr, bufs[t.name].nbytes, RAW[dt])
            host[t.name] = from_device_bytes(raw, DType(dt)).reshape(t.shape(c))
    refs = {t.name: worker.to_host(bufs[f"ref:{t.name}"].ptr, bufs[f"ref:{t.name}"].nbytes, np.float64).reshape(t.shape(c))
            for t in VARIANT_SPEC.outputs() if t.name in bound}
    for b in alloc:
        worker.free(b)
    return host, refs


@pytest.mark.gpu
@pytest.mark.parametrize("kind", VARIANT_SPEC.gate_kinds())
@pytest.mark.parametrize("c", CELLS, ids=lambda c: c.label().replace(" ", "-"))
def test_variant_device_reference_matches_numpy(worker, c, kind):
    host, refs = run_reference(worker, c, kind, uses(c))
    want = VARIANT_SPEC.reference(host, VARIANT_SPEC.scalar_values(c))
    for name, got in refs.items():
        # float64 on both sides, summed in different orders: an element that cancels (h * rstd * w + bias
        # near 0) keeps an absolute error of a few ulps of the row's scale, not of itself (the H200
        # measured 2.2e-16 on an element of 1.8e-7: 1.2e-9 relative), so the bound is relative to the
        # output's largest magnitude
        scale = float(np.max(np.abs(want[name]))) or 1.0
        np.testing.assert_allclose(got, want[name], rtol=1e-9, atol=1e-13 * scale, err_msg=f"{kind} {c.label()} {name}")


@pytest.mark.gpu
@pytest.mark.parametrize("drop, add", [("residual", ""), ("residual_out", ""), ("", "bias"), ("", "rstd")])
def test_a_plan_binding_another_variant_gets_nan_references(worker, drop, add):
    c = Cell.make({"x": "bf16", "w": "bf16", "residual": "bf16"}, {"M": 3, "N": 256})
    _, refs = run_reference(worker, c, "normal", (uses(c) - {drop}) | ({add} if add else set()))
    assert np.all(np.isnan(refs["y"]))
