"""The exported runtime's launch arguments (evo/export/runtime/package/args.py): a tensor's pointer, dims
and scalars in their declared types, and "name?" tensors the call leaves out as null pointers."""

from __future__ import annotations

import numpy as np
import pytest

from evo.export.runtime.package.args import bind_args, plan_args

ARGS = ["x", "residual?", "w", "bias?", "y", "M", "eps", "N:i64"]


def test_a_conditional_tensor_binds_its_pointer_when_given_and_null_when_left_out():
    ptrs = {"x": 0x1000, "w": 0x2000, "y": 0x3000, "bias": 0x4000}
    got = bind_args(ARGS, ptrs, {"M": 7, "N": 4100}, {"eps": 1e-6}, {"eps": "f32"}, "t")
    assert [type(a) for a in got] == [np.uint64] * 5 + [np.int32, np.float32, np.int64]
    assert [int(a) for a in got[:5]] == [0x1000, 0, 0x2000, 0x4000, 0x3000]
    assert int(got[5]) == 7 and got[6] == np.float32(1e-6) and int(got[7]) == 4100


def test_a_required_name_that_is_nothing_is_an_error_naming_it():
    with pytest.raises(KeyError, match="'w'"):
        bind_args(["x", "w"], {"x": 1}, {}, {}, {}, "cta_row_fused (rmsnorm)")


@pytest.mark.parametrize("ptrs", [{"x": 0x1000, "w": 0x2000, "y": 0x3000, "bias": 0x4000},
                                  {"x": 0x1000, "w": 0x2000, "y": 0x3000, "residual": 0x5000}])
def test_an_arg_plan_binds_what_bind_args_binds_with_its_dims_bound_once(ptrs):
    dims, kinds = {"M": 7, "N": 4100}, {"eps": "f32"}
    plan = plan_args(ARGS, {"x", "w", "y", "residual", "bias"}, dims, kinds, "t")
    assert sum(a is not None for a in plan.fixed) == 2  # M and N, bound once
    for eps in (1e-6, 1e-5):
        want = bind_args(ARGS, ptrs, dims, {"eps": eps}, kinds, "t")
        got = plan.bind(ptrs, {"eps": eps})
        assert [type(a) for a in got] == [int] * 5 + [np.int32, np.float32, np.int64]  # pointers as Python ints
        assert got[:5] == [int(a) for a in want[:5]]
        assert [a.item() for a in got[5:]] == [a.item() for a in want[5:]]


def test_an_arg_plan_names_a_required_tensor_or_scalar_the_call_does_not_give():
    plan = plan_args(ARGS, {"x", "w", "y", "residual", "bias"}, {"M": 7, "N": 4100}, {"eps": "f32"}, "cta_row (rmsnorm)")
    with pytest.raises(KeyError, match="cta_row.*'w'"):
        plan.bind({"x": 1, "y": 2}, {"eps": 1e-6})
    with pytest.raises(KeyError, match="'eps'"):
        plan.bind({"x": 1, "w": 3, "y": 2}, {})


def test_an_arg_plan_refuses_a_name_that_is_nothing_before_any_call():
    with pytest.raises(KeyError, match="'gamma'"):
        plan_args(["x", "gamma"], {"x"}, {"M": 1}, {"eps": "f32"}, "t")


def test_cuda_core_packs_a_python_int_pointer_as_the_same_eight_bytes_as_a_uint64():
    """ArgPlan.bind passes pointers as Python ints: cuda.core's launch must pack them pointer-sized, as it packs
    the np.uint64 bind_args gives (read back from the kernel-parameter array it builds)."""
    import ctypes

    from cuda.core._kernel_arg_handler import ParamHolder

    p = 0x7F00_1234_5678
    held = ParamHolder([p, np.uint64(p), 0, np.int32(7)])
    slots = (ctypes.c_void_p * 4).from_address(held.ptr)
    as_u64 = [ctypes.c_uint64.from_address(slots[i]).value for i in range(3)]
    assert as_u64 == [p, p, 0] and ctypes.c_int32.from_address(slots[3]).value == 7


def test_a_direct_launch_binds_what_the_plan_binds_from_positional_values():
    """The serving path's args (launch.Direct): the tensors' pointers then the scalars, positionally; an optional
    tensor the calls never pass is a null pointer bound once, a required one or a missing scalar refuses."""
    from evo.export.runtime.package.args import direct_args

    dims, kinds = {"M": 7, "N": 4100}, {"eps": "f32"}
    plan = plan_args(ARGS, {"x", "w", "y", "residual", "bias"}, dims, kinds, "t")
    tensors = ("x", "w", "y", "residual")
    fixed, slots = direct_args(plan, tensors, ("eps",))
    values = (0x1000, 0x2000, 0x3000, 0x5000, 1e-5)
    got = list(fixed)
    for i, k, cast in slots:
        got[i] = values[k] if cast is None else cast(values[k])
    want = plan.bind(dict(zip(tensors, values)), {"eps": 1e-5})
    assert got == want and [type(a) for a in got] == [type(a) for a in want]
    assert direct_args(plan, ("x", "y"), ("eps",)) == (None, ())  # w is required
    assert direct_args(plan, tensors, ()) == (None, ())
