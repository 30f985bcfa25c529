"""Shared by every family's package: each searched cell's launches get from the ArgPlan the launcher keeps per
choice the arguments bind_args gives for the same call (pointers, dims and scalars in their declared types, null
pointers for the "name?" tensors a call leaves out), in order; a pointer as a Python int."""

from __future__ import annotations

import kf_pkg as kf
import pytest
from kf_pkg.args import bind_args, plan_args

TABLES = kf.tables()
ENTRIES = [(op, e) for op, t in TABLES.items() for e in t.entries]


@pytest.mark.parametrize("op, entry", ENTRIES, ids=[f"{op}:{e.cell}" for op, e in ENTRIES])
def test_a_kept_arg_plan_binds_what_bind_args_binds(op, entry):
    table = TABLES[op]
    template = table.templates[entry.template]
    dims = {**table.dim_defaults, **dict(entry.dims)}
    launches, workspaces = template.plan(dict(entry.params), table.arch_number, dict(entry.dtypes), dims)
    assert launches, f"{entry.cell}: no launch"
    tensors = {t.name for t in table.tensors} | set(workspaces)
    kinds = dict(table.scalars)
    scalars = {n: 0.75 + 2 * i for i, n in enumerate(kinds)}
    optional = {a.partition(":")[0].removesuffix("?") for ln in launches for a in ln.args
                if a.partition(":")[0].endswith("?")}
    for left_out in ({*()}, optional):
        ptrs = {n: 0x1000 * (i + 1) for i, n in enumerate(sorted(tensors)) if n not in left_out}
        for ln in launches:
            want = bind_args(ln.args, ptrs, dims, scalars, kinds, template.name)
            plan = plan_args(ln.args, tensors, dims, kinds, template.name)
            got = plan.bind(ptrs, scalars)
            pointers = {i for i, _, _ in plan.ptrs}  # bound as Python ints (pointer-sized in cuda.core's launch)
            assert [int if i in pointers else type(a) for i, a in enumerate(want)] == [type(a) for a in got], ln.kernel
            assert [a.item() for a in want] == [a if i in pointers else a.item() for i, a in enumerate(got)], ln.kernel
