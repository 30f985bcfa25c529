"""On a GPU: a peer's outputs are checked against the gate's float64 reference before it is timed; torch
eager passes as an RMSNorm peer on a real cell, the same peer scaled by 1.05 is reported absent (1.05: outside
twice bf16's tolerance, as 1.01 is not)."""

from __future__ import annotations

import pytest

from ops.rmsnorm import device as rms_device
from ops.rmsnorm.spec import SPEC, cell


@pytest.fixture(scope="module")
def worker():
    from evo.measure.worker import Worker

    return Worker()


@pytest.mark.gpu
@pytest.mark.parametrize("dt", ["bf16", "fp16", "fp32"])
def test_torch_eager_passes_the_peer_check_and_a_scaled_copy_does_not(worker, monkeypatch, dt):
    from evo.build.nvrtc import compile_one, prepare
    from evo.core.genome import Genome
    from evo.core.status import Status
    from evo.measure.evaluate import make_job
    from evo.measure.jobs import Timing
    from evo.measure.verify import judge
    from evo.templates.template import load_templates

    offered = rms_device.baselines

    def with_scaled(torch, names):  # the hook's torch eager, and a copy of it 5% off
        eager = offered(torch, ("torch.rms_norm",))["torch.rms_norm"]
        return {"torch.rms_norm": eager, "torch.rms_norm*1.05": lambda t, s: eager(t, s) * 1.05}

    monkeypatch.setattr(rms_device, "baselines", with_scaled)
    c = cell(dt, 64, 4096)
    tdef = load_templates("rmsnorm")["cta_row"]
    g = Genome.make("rmsnorm", "cta_row", tdef.source_hash, tdef.default_params())
    build = compile_one(prepare(tdef, g, "sm_90a", c.dtypes_dict(), c.dims_dict()))
    assert build.status.ok, build.error
    job = make_job(SPEC, tdef, g, build, c, 90, seed=3, timing=Timing(min_samples=10, max_samples=10, warmup=2),
                   baselines=("torch.rms_norm", "torch.rms_norm*1.05"))
    res = worker.run(job)
    out = judge(res, {k: t[2] for k, t in job.tolerances}, g, c, build.build_key)
    assert out.status is Status.OK, (out.status, out.error)
    assert [n for n, _ in res.peers] == ["torch.rms_norm"], (res.peers, res.absent)
    assert dict(res.peers_checked)["torch.rms_norm"].startswith("ok at 2 x tolerance: y rel norm err")
    assert dict(res.absent)["torch.rms_norm*1.05"].startswith("wrong: y "), res.absent
