"""Every registered op declares what the engine needs; its numpy reference runs on every input kind."""

from __future__ import annotations

import numpy as np
import pytest

from evo.core import contract, registry
from evo.core.spec import Role


@pytest.mark.parametrize("name", registry.KNOWN)
def test_op_is_complete(name):
    spec = registry.get_op(name)
    assert contract.problems(spec) == []


@pytest.mark.parametrize("name", [n for n in registry.KNOWN if contract.has_templates(n)])
def test_runnable_op_reference_on_every_kind(name):
    spec = registry.get_op(name)
    c = spec.edge_cells()[0]
    for kind in spec.gate_kinds():
        inputs = spec.make_inputs(c, kind, np.random.default_rng(0))
        out = spec.reference(inputs, spec.scalar_values(c))
        for t in spec.tensors:
            if t.role is Role.OUT:
                assert out[t.name].shape == t.shape(c), (kind, t.name)
                assert np.all(np.isfinite(out[t.name])), (kind, t.name)


def test_registry_is_the_ops_folders():
    assert {"rmsnorm", "softmax", "kda"} <= set(registry.KNOWN)
    with pytest.raises(registry.UnknownOpError, match="known ops"):
        registry.get_op("layernorm")


def test_contract_names_what_is_missing():
    import dataclasses

    spec = registry.get_op("softmax")
    broken = dataclasses.replace(spec, fills={"normal": {}}, baselines=(), timing_kinds=("fast",))
    text = " | ".join(contract.problems(broken))
    assert "input kind 'normal' fills []" in text and "no baseline" in text and "timing_kinds" in text
    kda = registry.get_op("kda")
    loop = dataclasses.replace(kda.recurrence, state_in="o", kind="calm")
    text = " | ".join(contract.problems(dataclasses.replace(kda, recurrence=loop)))
    assert "'o' must be an input" in text and "kind 'calm' must be an input kind" in text
