"""The RMSNorm package's README: what it holds, how to use it, where every number comes from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def readme(name: str, runs: Sequence[Any], cell_kernel: dict[str, dict[str, str]],
           provenance: dict[str, Any], parts: Any) -> str:
    """README.md of a package exported from a forward run, a backward run, or one of each."""
    cells_table, install, measured, tests_and_bench = (parts.cells_table, parts.install, parts.measured,
                                                       parts.tests_and_bench)
    fwd = next((r for r in runs if r.op == "rmsnorm"), None)
    bwd = next((r for r in runs if r.op == "rmsnorm_bwd"), None)
    arch = runs[0].arch
    origin = " and ".join(
        f"{'runs' if len(r.run_ids) > 1 else 'run'} {' and '.join(f'`{i}`' for i in r.run_ids)} "
        f"({'forward' if r is fwd else 'backward'})" for r in (fwd, bwd) if r)
    variant_cells = [e for e in fwd.entries if _is_variant(e)] if fwd else []
    lines = [
        f"# {name}",
        "",
        (f"RMSNorm CUDA kernels found by Kernel Factory's search, exported from {origin}, built for `{arch}`. "
         "The package holds"),
        "the rendered CUDA source and the cubin the search measured for every cell of the dispatch table, the",
        "templates they were rendered from (for shapes outside the table), a loader through cuda-python",
        "(cuda.core), `torch.library` custom ops with autograd (what torch.compile traces; eager calls take an",
        "autograd.Function over the same kernels, less host time a call), and a QuACK-compatible API.",
        "",
        *install("off-table N and other GPUs compile at first use"),
        "`import` needs neither a GPU nor torch (`explain`, `tables`, `provenance` read the shipped data); the",
        "torch API imports torch and registers the custom ops on first use.",
        "",
        "## Use",
        "",
        "```python",
        f"import torch, {name} as kf",
        "x = torch.randn(4096, 8192, device='cuda', dtype=torch.bfloat16, requires_grad=True)",
        "w = torch.ones(8192, device='cuda', dtype=torch.bfloat16, requires_grad=True)",
        "y = kf.rmsnorm(x, w, eps=1e-6)          # QuACK's signature, with autograd",
        "y.sum().backward()",
        "print(kf.explain(x.shape, x.dtype))     # which kernel this shape gets, and why",
        "print(kf.stats())                        # calls per path in this process",
        "```",
        "",
        "- `rmsnorm(x, weight=None, bias=None, residual=None, out_dtype=None, residual_dtype=None, eps=1e-6,",
        "  prenorm=False)`: over the last dim; with `prenorm`, returns `(out, residual_out)`.",
        "- `rmsnorm_fwd(x, weight=None, bias=None, residual=None, out_dtype=None, residual_dtype=None, eps=1e-6,",
        "  store_rstd=False, *, out=None, residual_out=None) -> (out, residual_out, rstd)` and `rmsnorm_bwd(x,",
        "  weight, dout, rstd, dresidual_out=None, has_bias=False, has_residual=False) -> (dx, dw, db, dresidual)`,",
        "  as QuACK's; given `out` (and `residual_out`), the call writes into them and allocates nothing.",
        "- `RMSNorm(dim, eps=1e-6)`: a `torch.nn.RMSNorm` computed by `rmsnorm`.",
        f"- Custom ops `torch.ops.{name}.rmsnorm_fwd(x, weight, eps)` (2-d x) with autograd, and",
        f"  `torch.ops.{name}.rmsnorm_bwd(x, weight, dout, rstd) -> (dx, dw)`, registered by `import {name}.ops`",
        "  (or the first API call); both have fake kernels for torch.compile.",
        "",
        "## Which path a call takes (`explain`)",
        "",
        "- `table`: a searched cell: the cubin the search measured there.",
        "- `table-build`: another M (or any shape) served by a prebuilt cubin of the table (same genome, dtypes",
        "  and compiled-in dims); the factory's gate ran that cubin at M = 1 and 37 as well (forward: and 1059).",
        "- `rerender`: the nearest searched genome (same dtypes first, then nearest dims) whose template admits",
        "  the shape, rendered for it from the shipped template and compiled with NVRTC at first use. Templates",
        "  compile N into the code (`specialize` in their header), so a new N needs this. Cubins are cached in",
        f"  `~/.cache/{name}` (`{name.upper()}_CACHE_DIR`).",
        "- `repaired`: no searched genome is legal for the shape as it is; the nearest one with the fewest",
        "  parameters changed so that its template's constraints hold, rendered and compiled as above.",
        "- `torch`: float32 torch operations, correct but not searched: a variant (residual add, bias,",
        "  store_rstd) the export has no cell of, or of another residual dtype; an `out_dtype` other than x's,",
        "  CPU tensors, a shape no exported template admits, or a kernel that failed to compile or check.",
        "  `weight=None` runs the kernels with a weight of ones (exact).",
        "",
        "Every kernel (the table's too) is checked against a float64 reference the first time it runs in each shape",
        "class: at the class's M (M itself up to 64, else 64 plus M mod 64) on random rows with a drawn eps, every",
        "row and dw checked. A kernel that fails to compile or to check is not used again in the process; a",
        f"warning says why and its calls take the `torch` path (`{name.upper()}_SELFCHECK=0` turns the check off).",
        "Inside CUDA graph capture a class not yet checked takes the `torch` path: call once before capturing.",
        "",
        "Decision: the package ships the templates and a small Jinja renderer (the factory's sandbox settings)",
        "rather than pre-rendered variants, because N is compiled into the code and the set of N users call",
        "with is open. The renderer gives back every shipped source exactly (`tests/test_cpu.py`).",
        "",
        "## Backward",
        "",
    ]
    if bwd:
        lines += [f"Backward kernels from run `{bwd.run['run_id']}` compute dx and dw (`rmsnorm_bwd`, and autograd",
                  "through `rmsnorm`) in two launches per call: the rows kernel writes dx and one fp32 partial dw row",
                  "per row group into a workspace the package allocates (its size is the template's `[workspace]`",
                  "expression), then a column-sum kernel writes dw. The forward kernels do not store rstd, so",
                  "autograd recomputes it from x in float32 torch (one extra read of x). A `dout` of another dtype",
                  "than x takes the torch path.", ""]
        lines += cells_table(bwd) + [""]
    else:
        lines += ["No backward run was exported: the backward (autograd, `rmsnorm_bwd`) is float32 torch",
                  "(`reference.backward_2d`), correct and not searched. rstd is recomputed from x in float32.", ""]
    lines += ["## Variants", ""]
    if variant_cells:
        kinds = sorted({_describe(e) for e in variant_cells})
        lines += ["A call is keyed as the factory keys a cell: its dtypes (x, w, and the residual's for a residual add)",
                  "and dims (M, N, and bias = 1, store_rstd = 1 when on). This export has cells of the variants",
                  f"{', '.join(kinds)} ({', '.join(sorted({e.genome.template for e in variant_cells}))}): such a call",
                  "(`rmsnorm(x, w, bias, residual, prenorm=True)`, `rmsnorm_fwd(..., store_rstd=True)`) takes those",
                  "cells' kernels in one pass (h = x + residual, residual_out = h in the residual's dtype, y = h * rstd",
                  "* w (+ bias), rstd stored), on the same paths as the plain op (`table`, `table-build`, `rerender`,",
                  "`repaired`, each rendered with the variant's switches compiled in); a variant or residual dtype no",
                  "cell has takes `torch` and `explain(..., residual=True | dtype, bias=True, store_rstd=True)` says",
                  "why. The backward of such a call is `rmsnorm_bwd` on h (rstd recomputed from h), dresidual = dx =",
                  "dh + dresidual_out, db = the column sum of dout. store_rstd alone without a store_rstd cell keeps",
                  "the plain kernel, rstd computed by torch.", ""]
    else:
        lines += ["No variant cell was exported: a residual add or a bias takes `torch`; store_rstd keeps the plain",
                  "kernel, rstd computed by torch. A run of the variants (cta_row_fused over the op's `residual`",
                  "and `bias_rstd` matrices) exported beside the forward run serves them.", ""]
    lines += ["## Forward cells (as measured by the search)", ""]
    if fwd:
        lines += cells_table(fwd) + [""]
    else:
        lines += ["No forward run was exported: `rmsnorm` and `rmsnorm_fwd` compute the forward in float32 torch",
                  "(`reference.forward_2d`), correct and not searched; `explain(shape, dtype)` says `torch`.", ""]
    for r in runs:
        lines += [f"`{r.op}`{f' (runs {chr(44).join(r.run_ids)})' if len(r.run_ids) > 1 else ''}: {measured(r, provenance)} `source = replay` means the times are recorded measurements "
                  "replayed by the search, not a fresh GPU run.", ""]
    lines += [
        *tests_and_bench(name, "torch eager, torch.compile, Liger, QuACK (heuristic and autotuned), FlashInfer and "
                               "cuDNN frontend"),
        "Its tables: `forward` (`rmsnorm`), `residual` (`rmsnorm_fwd` with a residual: y and residual_out),",
        "`backward` (`rmsnorm_bwd` given rstd), `train` (forward and backward through autograd, as a model",
        "calls it), and `serving` and `serving_residual` (M from 1 to 2048 rows, where call time is what counts).",
        "The GPU tests compare every searched cell, off-table shapes (M = 1, odd M and N, mixed",
        "weight dtype, long rows), every API variant, autograd and torch.compile with a float64 reference.",
        "",
        "## Provenance",
        "",
        f"`{name}/data/provenance.json`: the runs (config included), the fingerprints of the measurements (GPU,",
        "clocks, driver, CUDA and NVRTC versions), the factory commit and NVRTC used for the export; every",
        f"evaluation of each run is in `{name}/data/results/`. `{name}/data/dispatch.json` is the table the runtime",
        "reads: per cell the kernel and its measurement, per template its space, constraints and launch plan.",
        "",
        "## Not covered",
        "",
        "- Variants no exported cell has run in float32 torch (see above), not fused.",
        "- Thread-block clusters are compiled into the kernels (`__cluster_dims__`), so they launch as ordinary",
        "  kernels; the loader refuses a launch whose grid is not a multiple of the cluster (`loader.check_grid`).",
        "- The prebuilt cubins load only on the exact arch they were built for; other GPUs compile at first use.",
        "",
    ]
    return "\n".join(lines)


def _is_variant(e: Any) -> bool:
    return "residual" in e.dtypes or "out" in e.dtypes or bool(e.dims.get("bias")) or bool(e.dims.get("store_rstd"))


def _describe(e: Any) -> str:
    """'residual bf16 + bias + store_rstd', as the package's choose.describe says a variant."""
    parts = [f"residual {e.dtypes['residual']}"] if "residual" in e.dtypes else []
    parts += [f"out {e.dtypes['out']}"] if "out" in e.dtypes else []
    parts += [d for d in ("bias", "store_rstd") if e.dims.get(d)]
    return " + ".join(parts)
