"""Run the adversarial gallery through the real runner; used by tests/gpu and the committed script."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from evo.build import BuildInput, compile_one
from evo.genome import Genome
from evo.jobs import BufferDecl, EvalJob, LaunchJob, Timing
from evo.run import GpuRunner
from evo.status import Status
from evo.verify import judge
from ops.rmsnorm.spec import SPEC, cell

SOURCE = Path(__file__).with_name("gallery.cu")
# (name, expected status); GOOD runs first and last to show the runner survives everything between.
CASES = (
    ("GOOD", Status.OK),
    ("ZEROS", Status.WRONG_ANSWER),
    ("SKIP_TAIL", Status.WRONG_ANSWER),
    ("UNWRITTEN", Status.WRONG_ANSWER),
    ("OVERRUN", Status.WRONG_ANSWER),
    ("FP16_ACC", Status.WRONG_ANSWER),
    ("SPIN", Status.TIMEOUT),
    ("FAULT", Status.CRASH),
    ("FIRST_ONLY", Status.WRONG_ANSWER),
    ("RACE", Status.WRONG_ANSWER),
    ("GOOD", Status.OK),
)
CELL = cell("fp16", 1037, 4100)  # N % 8 == 4: a partial last vector; M not a multiple of 8
KINDS = ("normal", "large", "normal")


@dataclass(frozen=True)
class GalleryOutcome:
    name: str
    expected: str
    got: str
    error: str
    median_us: float


def build(variant: str) -> bytes:
    src = f"#define VARIANT {variant}\n" + SOURCE.read_text()
    g = Genome.make("rmsnorm", f"gallery_{variant}", hashlib.sha256(src.encode()).hexdigest(), {})
    r = compile_one(BuildInput(g, "sm_90a", (("w", "float16"), ("x", "float16")), (), src, ("gallery",), 256))
    if r.status is not Status.OK:
        raise RuntimeError(f"gallery variant {variant} did not compile: {r.error}\n{r.log}")
    return r.cubin


def job(variant: str, cubin: bytes, seed: int) -> EvalJob:
    m, n = CELL.dim("M"), CELL.dim("N")
    bufs = tuple(BufferDecl(t.name, t.resolve_dtype(CELL).value, t.shape(CELL), t.role.value) for t in SPEC.tensors)
    args = (("buf", "x"), ("buf", "w"), ("buf", "y"), ("i32", m), ("i32", n), ("f32", 1e-6))
    tol = SPEC.tolerance(CELL, "y")
    return EvalJob(f"gallery-{variant}-{seed}", "rmsnorm", tuple(sorted(CELL.dims_dict().items())),
                   tuple(sorted(CELL.dtypes_dict().items())), cubin, (LaunchJob("gallery", (m, 1, 1), (256, 1, 1), 0, args),),
                   bufs, (("eps", 1e-6),), KINDS, (("y", (tol.atol, tol.rtol, tol.rel_norm)),), seed,
                   Timing(min_samples=100, max_samples=200), baseline=True)


def run_gallery(timeout_s: float = 20.0) -> tuple[list[GalleryOutcome], dict[str, str], int]:
    """Every case in one runner; returns outcomes, the fingerprint and the number of worker restarts."""
    cubins = {name: build(name) for name, _ in CASES}
    out = []
    with GpuRunner(timeout_s=timeout_s) as runner:
        for i, (name, expected) in enumerate(CASES):
            res = runner.run([job(name, cubins[name], seed=100 + i)])[0]
            v = judge(res, {"y": SPEC.tolerance(CELL, "y").rel_norm})
            out.append(GalleryOutcome(name, expected.value, v.status.value, v.error, v.median_us))
        return out, runner.fingerprint, runner.handles[0].restarts
