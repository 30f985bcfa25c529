"""Run the adversarial gallery through the real runner; used by tests/gpu and the committed script.

Every kernel of gallery.cu runs on two cells: a small one the baseline puts in CUDA-graph timing and a
large one timed launch by launch, so each cheat meets both timing modes. Each case names the statuses
it may get; every cheat must be rejected (or SUSPECT), every honest control OK.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

from evo.build.nvrtc import BuildInput, compile_one
from evo.core.genome import Genome
from evo.measure.draws import new_secret, scalar_rng, shape_rng
from evo.measure.jobs import BufferDecl, EvalJob, GateCell, LaunchJob, Timing
from evo.measure.run import GpuRunner
from evo.core.status import Status
from evo.measure.verify import judge
from ops.rmsnorm.spec import SPEC, cell
from evo.core.spec import Cell

SOURCE = Path(__file__).with_name("gallery.cu")
WRONG = (Status.WRONG_ANSWER,)
# (name, allowed statuses, what it tries); GOOD runs first and last to show the runner survives everything between.
CASES: tuple[tuple[str, tuple[Status, ...], str], ...] = (
    ("GOOD", (Status.OK,), "honest control"),
    ("ZEROS", WRONG, "writes zeros"),
    ("SKIP_TAIL", WRONG, "skips the last partial vector of each row"),
    ("UNWRITTEN", WRONG, "leaves every 7th row unwritten"),
    ("OVERRUN", WRONG, "writes past the end of the output"),
    ("FP16_ACC", WRONG, "accumulates x^2 in fp16"),
    ("SPIN", (Status.TIMEOUT,), "spins forever"),
    ("FAULT", (Status.CRASH,), "illegal address"),
    ("FIRST_ONLY", WRONG, "works on its first launch only"),
    ("RACE", WRONG, "missing barrier in the reduction"),
    ("ZERO_WEIGHT", (Status.INPUT_MODIFIED,), "zeroes the weight so a reference computed afterwards agrees"),
    ("INPLACE_X", (Status.INPUT_MODIFIED,), "right output, also written over x"),
    ("NAN_DETECT", WRONG, "works only when its output holds NaN (the old poison)"),
    ("LAUNCH_COUNT", WRONG, "works on the first 12 launches only"),
    ("SKIP_SEEN_PTR", WRONG, "skips an (x, y) pointer pair it has seen"),
    ("PTR_CACHE", WRONG, "caches rstd per row by x pointer"),
    ("SAMPLED_CACHE", WRONG, "caches rstd by x pointer plus two sampled elements"),
    ("NO_EPS", WRONG, "drops eps"),
    ("SKIP_REDUCTION", WRONG, "rstd = 1"),
    ("PARTIAL_REDUCTION", WRONG, "mean square of the first quarter of each row"),
    ("NO_WEIGHT", WRONG, "ignores the weight"),
    ("WS_UNZEROED", WRONG, "assumes a zeroed workspace"),
    ("PROBE_SKIP", WRONG, "skips where the old gate probed the timing mode"),
    ("TIMER_SKIP", WRONG, "skips launches that follow the previous one within 500 us (timed loops)"),
    ("CENTRED", WRONG, "subtracts the row mean (LayerNorm)"),
    ("SHARED_SCRATCH", WRONG, "a row's sum through a __device__ scratch that a call on another stream overwrites"),
    ("GRID_BARRIER", (Status.INVALID, Status.TIMEOUT), "its first 132 CTAs wait for each other (no cooperative launch)"),
    ("EPS_FOLDED", WRONG, "eps folded to its default 1e-6, whatever the call passes (drawn eps on check cells)"),
    ("GUARD_SNIFF", WRONG, "honest only where the 16 bytes before x hold an earlier gate's constant guard"),
    ("L2_KEEP", (Status.OK, Status.SUSPECT), "probe: x loaded with an L2 evict_last policy"),
    ("SUSPECT_BYTES", (Status.SUSPECT,), "GOOD, with the job claiming 64x the bytes: the ceiling check"),
    ("GOOD_CLUSTER", (Status.OK,), "honest control with a cluster launch (gate 10 checked it unlaunched)"),
    ("GOOD", (Status.OK,), "honest control"),
)
CHEATS = tuple(name for name, allowed, _ in CASES if Status.OK not in allowed and name != "SUSPECT_BYTES")
# A cell timed as a CUDA graph (its bytes take 0.13 us at the copy ceiling) and one timed launch by
# launch (31 us); N % 8 == 4 (a partial vector), M not a multiple of 8.
CELLS = {"graph": cell("fp16", 131, 1028), "direct": cell("fp16", 4099, 8196)}


@dataclass(frozen=True)
class GalleryOutcome:
    name: str
    cell: str
    allowed: tuple[str, ...]
    got: str
    passed: bool
    error: str
    median_us: float
    baseline_us: float
    graph: bool
    checks: int
    gbps: float


def build(variant: str) -> bytes:
    src = f"#define VARIANT {variant}\n" + SOURCE.read_text()
    g = Genome.make("rmsnorm", f"gallery_{variant}", hashlib.sha256(src.encode()).hexdigest(), {})
    r = compile_one(BuildInput(g, "sm_90a", (("w", "float16"), ("x", "float16")), (), src, ("gallery",), 256))
    if r.status is not Status.OK:
        raise RuntimeError(f"gallery variant {variant} did not compile: {r.error}\n{r.log}")
    return r.cubin


def _bound(c: Cell, eps: float, cluster: int = 1) -> tuple[tuple[LaunchJob, ...], tuple[BufferDecl, ...]]:
    """The gallery kernel's launch and buffers on cell c: a CTA a row (the grid rounded up to the kernel's cluster),
    the harness's args, a workspace of a float a row."""
    m, n = c.dim("M"), c.dim("N")
    bufs = [BufferDecl(t.name, t.resolve_dtype(c).value, t.shape(c), t.role.value) for t in SPEC.tensors]
    bufs.append(BufferDecl("ws", "uint8", (4 * m,), "ws"))
    args = (("buf", "x"), ("buf", "w"), ("buf", "y"), ("i32", m), ("i32", n), ("f32", eps), ("buf", "ws"))
    return (LaunchJob("gallery", (-(-m // cluster) * cluster, 1, 1), (256, 1, 1), 0, args),), tuple(bufs)


def job(variant: str, cubin: bytes, c: Cell, seed: int) -> EvalJob:
    """The gallery kernel's job on c, as the evaluator makes one: its check cells' shapes (M = 1, a small M, one past
    a wave, a small M at an odd N) and their eps drawn from a secret of the OS's, recorded with the result."""
    secret = new_secret()
    draws = scalar_rng(secret)
    gates = []
    cluster = 2 if variant == "GOOD_CLUSTER" else 1
    for gc in SPEC.gate_shapes(c, shape_rng(secret), lambda dim: 1):
        eps = float(SPEC.drawn_scalars(gc, draws)["eps"])
        launches, bufs = _bound(gc, eps, cluster)
        gates.append(GateCell(f"{gc.label()} eps={eps:.3g}", tuple(sorted(gc.dims_dict().items())), launches, bufs,
                              (("eps", eps),)))
    launches, bufs = _bound(c, 1e-6, cluster)
    tol = SPEC.tolerance(c, "y")
    return EvalJob(f"gallery-{variant}-{seed}", "rmsnorm", tuple(sorted(c.dims_dict().items())),
                   tuple(sorted(c.dtypes_dict().items())), cubin, launches,
                   bufs, (("eps", 1e-6),), SPEC.gate_kinds(), (("y", (tol.atol, tol.rtol, tol.rel_norm)),), seed,
                   Timing(min_samples=100, max_samples=200), baseline=True,
                   fills=tuple((k, tuple(sorted(v.items()))) for k, v in SPEC.fills.items()),
                   timing_kinds=SPEC.timing_kinds, bytes_moved=SPEC.bytes_moved(c), gate=tuple(gates), secret=secret)


def run_gallery(timeout_s: float = 20.0) -> tuple[list[GalleryOutcome], dict[str, str], int, float]:
    """Every case on every cell in one runner; returns outcomes, fingerprint, worker restarts, ceiling."""
    cubins = {name: build("GOOD" if name == "SUSPECT_BYTES" else name) for name, _, _ in CASES}
    out = []
    seed = 100
    with GpuRunner(timeout_s=timeout_s) as runner:
        plan = [(name, allowed, c) for name, allowed, _ in CASES for c in CELLS.values()]
        for name, allowed, c in plan:
            seed += 1
            j = job(name, cubins[name], c, seed)
            if name == "SUSPECT_BYTES":
                j = replace(j, bytes_moved=64 * j.bytes_moved)
            res = runner.run([j])[0]
            v = judge(res, {"y": SPEC.tolerance(c, "y").rel_norm}, Genome.make("rmsnorm", f"gallery_{name}", "", {}), c)
            us = v.median_us
            gbps = SPEC.bytes_moved(c) / (us * 1e3) if us < float("inf") else 0.0
            out.append(GalleryOutcome(name, c.label(), tuple(s.value for s in allowed), v.status.value,
                                      v.status in allowed, v.error, us, v.baseline_us, res.graph,
                                      len(res.checks), gbps))
        return out, runner.fingerprint, runner.handles[0].restarts, runner.ceiling_gbps
