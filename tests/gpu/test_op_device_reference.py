"""On a GPU: for every op with device hooks and every input kind, the device fill and the op's float64 device
reference agree with its numpy reference, and so do the element-wise error scales an op's reference gives (its
SCALED outputs)."""

import numpy as np
import pytest

from evo.core import registry
from evo.core import contract
from evo.core.spec import DType, Role, from_device_bytes

RAW = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "int32": np.int32}
NULL = type("Null", (), {"ptr": 0, "nbytes": 0})()
CASES = [(name, kind) for name in registry.KNOWN if contract.has_device_hooks(name)
         for kind in registry.get_op(name).gate_kinds()]


@pytest.fixture(scope="module")
def worker():
    from evo.measure.worker import Worker

    return Worker()


@pytest.mark.gpu
@pytest.mark.parametrize("name, kind", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_device_reference_matches_numpy(worker, name, kind):
    import importlib

    spec = registry.get_op(name)
    mod = importlib.import_module(f"ops.{name}.device")
    _, ref_obj = worker._op(name)
    for c in spec.edge_cells()[:3]:
        bufs, host = {}, {}
        # the tensors this cell and kind use (make_inputs gives them); an optional one left out is null
        used = set(spec.make_inputs(c, kind, np.random.default_rng(0)))
        ins = [t for t in spec.tensors if t.role is Role.IN and t.name in used]
        bufs |= {t.name: NULL for t in spec.tensors if t.role is Role.IN and t.name not in used}
        for i, t in enumerate(ins):
            dt = t.resolve_dtype(c).value
            shape = t.shape(c)
            n = int(np.prod(shape))
            bufs[t.name] = worker.alloc(n * DType(dt).nbytes)
            worker.fill(bufs[t.name], dt, n, shape[-1], spec.fills[kind][t.name].bind(c.dims_dict()), seed=11 + i)
        # the outputs this cell's variant has: those the device reference writes; the others' refs are null
        launches = mod.reference(c.dims_dict(), c.dtypes_dict(), spec.scalar_values(c))
        produced = {v[len("ref:"):] for _, _, _, args in launches for k, v in args if k == "buf" and v.startswith("ref:")}
        outs = [t for t in spec.tensors if t.role is Role.OUT and t.name in produced]
        bufs |= {f"ref:{t.name}": NULL for t in spec.tensors if t.role is Role.OUT and t.name not in produced}
        scaled = getattr(mod, "SCALED", ())
        for t in outs:
            for key in ("ref", "scale") if t.name in scaled else ("ref",):
                bufs[f"{key}:{t.name}"] = worker.alloc(int(np.prod(t.shape(c))) * 8)
        for kernel, grid, block, args in launches:
            worker.launch(ref_obj, kernel, grid, block, 0,
                          tuple(("ptr", bufs[v].ptr) if k == "buf" else (k, v) for k, v in args))
        worker.sync("reference")
        for t in ins:
            if t.role is Role.IN:
                dt = t.resolve_dtype(c).value
                raw = worker.to_host(bufs[t.name].ptr, bufs[t.name].nbytes, RAW[dt])
                host[t.name] = from_device_bytes(raw, DType(dt)).reshape(t.shape(c))
        want = spec.reference(host, spec.scalar_values(c))
        for t in outs:
            got = worker.to_host(bufs[f"ref:{t.name}"].ptr, bufs[f"ref:{t.name}"].nbytes, np.float64)
            np.testing.assert_allclose(got.reshape(t.shape(c)), want[t.name], rtol=1e-9, atol=1e-300,
                                       err_msg=f"{name} {kind} {c.label()}")
        # an output's element-wise error scale (the gate's atol unit there) against the op's numpy mirror
        want_scale = mod.error_scales(host) if scaled else {}
        for t in outs:
            if t.name in scaled:
                got = worker.to_host(bufs[f"scale:{t.name}"].ptr, bufs[f"scale:{t.name}"].nbytes, np.float64)
                np.testing.assert_allclose(got.reshape(t.shape(c)), want_scale[t.name], rtol=1e-9,
                                           err_msg=f"{name} {kind} {c.label()} scale:{t.name}")
                assert np.all(got >= 1.0)
        for b in bufs.values():
            if b is not NULL:
                worker.free(b)
