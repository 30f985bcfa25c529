"""How far a right fp32 dx (RMSNorm backward) lands from the float64 one on the gate's perturbed "normal" set,
against the element-wise bound without an error scale (atol + rtol |dx|: gates up to 6) and with dx's scale
(atol x max(1, |x| rstd^3 sum|dout w x| / N): the bound of |a x|, the term that carries the rounding of the row's
dot product, and of r dout w wherever the two cancel: gate 7).

Round C moves one element in 61 of x, dout and w to -v +- 16 x the fill's magnitude (x, dout ~16, w ~17.6). A row
where one column has all three moved gets a dot-product term of ~4600: its fp32 rounding (an ulp of 4096-8192 is
4.9e-4) moves a = rstd^3 dot / N, and every dx element pays |x| x that; where dx's two terms cancel, its value is
small and so is rtol |dx|. dx is computed as the templates do: fp32 products, the dot summed sequentially by each
thread over its items, the threads' sums by a tree, a = r^3 s / N, dx = r g w - a x. Writes
build/dx_rounding.json. Usage: python experiments/scripts/dx_rounding.py [SEEDS (4)]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

from evo.measure.gate import PERTURB_EVERY
from ops.rmsnorm_bwd.device import error_scales
from ops.rmsnorm_bwd.spec import FILLS

ROWS, N, THREADS = 8192, 4096, 256  # each thread owns N / THREADS elements of a row
ATOL = RTOL = 1e-5  # fp32 dx: ops/rmsnorm TOLERANCES[fp32]


def perturbed(rng: np.random.Generator, shape: tuple[int, ...], spec) -> np.ndarray:
    """A fill of the normal kind, then round C's move of one element in PERTURB_EVERY, in fp32."""
    v = (spec.mean + spec.std * rng.standard_normal(shape)).astype(np.float32)
    hit = rng.integers(0, PERTURB_EVERY, shape) == 0
    amount = np.float32(16.0 * spec.magnitude())
    v[hit] = -v[hit] + np.where(rng.integers(0, 2, int(hit.sum())) == 1, amount, -amount)
    return v


def fp32_dx(x: np.ndarray, w: np.ndarray, g: np.ndarray, r: np.ndarray) -> np.ndarray:
    t = (g * w) * x  # fp32 products
    per = t.reshape(t.shape[0], THREADS, -1)  # thread k owns a contiguous run (the order within is what matters)
    s = np.cumsum(per, axis=2, dtype=np.float32)[:, :, -1].sum(axis=1, dtype=np.float32)  # then a tree
    a = (r * r * r * s * np.float32(1.0 / N)).astype(np.float32)
    return (r[:, None] * g * w - a[:, None] * x).astype(np.float64)


def cancel_one_per_row(x: np.ndarray, w: np.ndarray, g: np.ndarray, r: np.ndarray) -> np.ndarray:
    """g with one element a row (the first whose x was moved) set so that its dx's two terms cancel: dx ~ 0 there,
    what random rows reach now and then (two GPU rejections, cluster kernels, max abs err 3.8e-5 and 3.9e-5)."""
    g = g.copy()
    j = np.argmax(np.abs(x) > 8.0, axis=1)
    rows = np.arange(x.shape[0])
    g[rows, j] = 0.0
    x64, w64, r2 = x.astype(np.float64), w.astype(np.float64), r.astype(np.float64) ** 2
    rest = np.sum(g.astype(np.float64) * w64 * x64, axis=1)
    xj, n = x64[rows, j], x.shape[1]
    # dx_j = r (g_j w_j - x_j r^2 (rest + g_j w_j x_j) / N) = 0, solved for g_j
    g[rows, j] = (xj * r2 * rest / (n * w64[j] * (1 - r2 * xj ** 2 / n))).astype(np.float32)
    return g


def main() -> int:
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    f = FILLS["normal"]
    rows = []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        x, g = perturbed(rng, (ROWS, N), f["x"]), perturbed(rng, (ROWS, N), f["dout"])
        w = perturbed(rng, (N,), f["w"])
        r = (f["rstd"].mean + f["rstd"].std * rng.standard_normal(ROWS)).astype(np.float32)  # never perturbed
        for case, gg in (("perturbed", g), ("perturbed, one cancelling element a row", cancel_one_per_row(x, w, g, r))):
            rows.append({"seed": seed, "case": case, **measure(x, w, gg, r)})
            print(rows[-1], flush=True)
    doc = {"rows": ROWS, "N": N, "threads": THREADS, "atol": ATOL, "rtol": RTOL, "perturb_every": PERTURB_EVERY,
           "seeds": rows}
    out = ROOT / "build" / "dx_rounding.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2))
    print(f"wrote {out}")
    return 0


def measure(x: np.ndarray, w: np.ndarray, g: np.ndarray, r: np.ndarray) -> dict:
    """The fp32 dx against float64: its largest error, and against the two bounds."""
    x64, g64, w64, r64 = (a.astype(np.float64) for a in (x, g, w, r))
    xhat = x64 * r64[:, None]
    ref = r64[:, None] * (g64 * w64 - xhat * np.mean(g64 * w64 * xhat, axis=1, keepdims=True))
    err = np.abs(fp32_dx(x, w, g, r) - ref)
    scale = error_scales({"x": x64, "w": w64, "dout": g64, "rstd": r64})["dx"]
    old = err / (ATOL + RTOL * np.abs(ref))
    new = err / (ATOL * scale + RTOL * np.abs(ref))
    return {"elements": int(err.size), "max_abs_err": float(err.max()),
            "max_of_old_bound": float(old.max()), "elements_past_old_bound": int((old > 1).sum()),
            "max_of_new_bound": float(new.max()), "elements_past_new_bound": int((new > 1).sum()),
            "median_scale": float(np.median(scale)), "max_scale": float(scale.max())}


if __name__ == "__main__":
    sys.exit(main())
