"""The exported runtime's launch arguments (evo/export/runtime/package/args.py): a tensor's pointer, dims
and scalars in their declared types, and "name?" tensors the call leaves out as null pointers."""

from __future__ import annotations

import numpy as np
import pytest

from evo.export.runtime.package.args import bind_args

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
