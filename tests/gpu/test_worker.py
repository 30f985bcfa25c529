"""On a GPU: the device fills and the float64 device reference agree with the numpy reference."""

import numpy as np
import pytest

from ops.rmsnorm.reference import rmsnorm_fwd
from ops.rmsnorm.spec import cell
from ops.spec import from_device_bytes


@pytest.mark.gpu
@pytest.mark.parametrize("dt, wdt, m, n, kind", [
    ("bfloat16", "bfloat16", 37, 1000, "normal"),
    ("float16", "float32", 5, 4100, "large"),
    ("float32", "float32", 3, 33, "normal"),
    ("float16", "float16", 64, 8192, "large"),
], ids=lambda v: str(v))
def test_device_reference_matches_numpy(dt, wdt, m, n, kind):
    from evo.worker import DeviceBuffer, Worker
    from ops.spec import DType

    w = Worker()
    mod, ref_obj = w._op("rmsnorm")
    c = cell(dt, m, n, wdt)
    dims, dtypes = c.dims_dict(), c.dtypes_dict()
    from evo.jobs import BufferDecl
    ins = [BufferDecl("x", dt, (m, n), "in"), BufferDecl("w", wdt, (n,), "in")]
    bufs = {b.name: DeviceBuffer(w.dev, w.stream, b.numel * DType(b.dtype).nbytes) for b in ins}
    bufs["ref:y"] = DeviceBuffer(w.dev, w.stream, m * n * 8)
    w._fill(mod, kind, dims, ins, bufs, seed=7)
    for kernel, grid, block, args in mod.reference(dims, dtypes, {"eps": 1e-6}):
        vals = tuple(np.uint64(bufs[v].ptr) if k == "buf" else {"i32": np.int32, "f64": np.float64}[k](v) for k, v in args)
        w.launch(ref_obj, kernel, grid, block, 0, vals)
    w.sync("ref")
    raw = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
    x = from_device_bytes(w.to_host(bufs["x"].ptr, m * n * DType(dt).nbytes, raw[dt]), DType(dt)).reshape(m, n)
    wt = from_device_bytes(w.to_host(bufs["w"].ptr, n * DType(wdt).nbytes, raw[wdt]), DType(wdt))
    ref = w.to_host(bufs["ref:y"].ptr, m * n * 8, np.float64).reshape(m, n)
    expect = rmsnorm_fwd({"x": x, "w": wt}, {"eps": 1e-6})["y"]
    assert np.isfinite(x).all() and x.std() > 0.5
    assert np.max(np.abs(ref - expect) / (np.abs(expect) + 1e-12)) < 1e-10
    if kind == "large" and dt == "float16":
        assert np.isinf(np.sum(x.astype(np.float16) ** 2, axis=1, dtype=np.float16)).any()
