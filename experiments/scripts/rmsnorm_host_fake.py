"""The host cost of an exported RMSNorm package's training step without a GPU: the package's Python path (its API,
the custom op or autograd.Function, autograd, the runtime's choice and launcher) with CPU tensors, every kernel launch
replaced by a no-op and the choice forced to the table's kernel, so what is timed is the host work a GPU call would
do minus the CUDA calls themselves (allocations are CPU ones). torch eager's rms_norm step on the same tensors is
timed beside (its real CPU compute: tiny tensors) as the control: each package runs in a process of its own (median
of --calls, the sides taking turns call by call), the packages taking turns for --rounds, and each process's package
step over its eager step is kept, so a noisy machine's drift cancels; the summary gives each package's median ratio.
The residual variant's prenorm step (y and residual_out both used) is timed too, at the op level, by the variant
custom op and, where the package has it, the autograd.Function (`ops.variant`), each over eager's x + residual, then
rms_norm.

    python experiments/scripts/rmsnorm_host_fake.py OUT.json PKG_DIR [PKG_DIR ...] [--calls 500] [--rounds 5]

PKG_DIR: an exported package's folder (kfactory export ... --out PKG_DIR), put first on the path; torch must import.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

CHILD = r"""
import json, statistics, sys, time
import torch
import kf_rmsnorm as kf
from kf_rmsnorm import api, run
from kf_rmsnorm.choice import Choice

calls = int(sys.argv[1])
rt = run.runtime()
tables = kf.tables()
entry = {op: next(e for e in tables[op].entries if dict(e.dtypes)["x"] == "float32") for op in ("rmsnorm", "rmsnorm_bwd")}

def table_choice(op, x, w):
    e = entry[op]
    m, n = x.shape
    return Choice(op, "table", (("M", m), ("N", n)), (("w", "float32"), ("x", "float32")), 90, "fake", e.template,
                  e.params)

rt.choice = table_choice
rt.launcher.run = lambda choice, tensors, scalars: None  # no kernel: the host path alone
x = torch.randn(8, 64, requires_grad=True)
w = torch.randn(64, requires_grad=True)
dy = torch.randn(8, 64)
sides = {"package": lambda: torch.autograd.grad(api.rmsnorm(x, w, eps=1e-6), (x, w), dy),
         "torch.eager": lambda: torch.autograd.grad(torch.nn.functional.rms_norm(x, (64,), w, 1e-6), (x, w), dy)}
ns = getattr(torch.ops, kf.__name__)
if hasattr(ns, "rmsnorm_fwd_variant"):  # the residual variant (prenorm) at the op level (the API sends a variant's
    from kf_rmsnorm import ops          # CPU tensors to torch), its launch faked as the plain one's
    rt.variant_choice = lambda x_, w_, res_, b_, store_: table_choice("rmsnorm", x_, w_)
    res = torch.randn(8, 64, requires_grad=True)
    dro = torch.randn(8, 64)

    def prenorm(fn):
        y, h, _ = fn(x, w, res, None, 1e-6, False)
        return torch.autograd.grad((y, h), (x, w, res), (dy, dro))

    def prenorm_eager():
        h = x + res
        return torch.autograd.grad((torch.nn.functional.rms_norm(h, (64,), w, 1e-6), h), (x, w, res), (dy, dro))

    sides["variant.custom_op"] = lambda: prenorm(ns.rmsnorm_fwd_variant)
    if hasattr(ops, "variant"):
        sides["variant.function"] = lambda: prenorm(ops.variant)
    sides["variant.torch.eager"] = prenorm_eager
for fn in sides.values():
    for _ in range(50):
        fn()
names = list(sides)
ts = {name: [] for name in names}
for i in range(calls):  # the sides take turns, in both orders: a drifting machine drifts for all of them
    for name in (names if i % 2 == 0 else names[::-1]):
        t0 = time.perf_counter()
        sides[name]()
        ts[name].append((time.perf_counter() - t0) * 1e6)
out = {name: statistics.median(t) for name, t in ts.items()}
paths = {op: dict(v) for op, v in kf.stats().items()}
print(json.dumps({"median_us": out, "paths": paths, "torch": torch.__version__}))
"""


def measure(pkg: Path, calls: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pkg), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", CHILD, str(calls)], capture_output=True, text=True, env=env, timeout=600,
                       check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{pkg}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def over_eager(median_us: dict[str, float]) -> dict[str, Any]:
    """The package's plain step over torch eager's, and each variant side's (custom op, Function) over the eager
    prenorm step (x + residual, then rms_norm), where the child timed them."""
    variant = {k.removeprefix("variant."): v / median_us["variant.torch.eager"] for k, v in median_us.items()
               if k.startswith("variant.") and k != "variant.torch.eager"}
    return {"package_over_eager": median_us["package"] / median_us["torch.eager"], "variant_over_eager": variant}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("packages", type=Path, nargs="+")
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    rows = []
    for _ in range(args.rounds):
        for pkg in args.packages:
            m = measure(pkg, args.calls)
            rows.append({"package": str(pkg), **m, **over_eager(m["median_us"])})
            print(f"{pkg}: " + ", ".join(f"{k} {v:.1f} us" for k, v in m["median_us"].items()))
    by_pkg = {str(p): [r for r in rows if r["package"] == str(p)] for p in args.packages}
    summary = {p: statistics.median(r["package_over_eager"] for r in rs) for p, rs in by_pkg.items()}
    print("median package / eager:", {k: round(v, 3) for k, v in summary.items()})
    variant = {p: {k: statistics.median(r["variant_over_eager"][k] for r in rs) for k in rs[0]["variant_over_eager"]}
               for p, rs in by_pkg.items()}
    print("median variant side / its eager:", variant)
    doc = {"method": __doc__.split("\n\n")[0], "calls": args.calls, "rounds": args.rounds,
           "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
           "python": platform.python_version(), "median_package_over_eager": summary,
           "median_variant_over_eager": variant, "rows": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
