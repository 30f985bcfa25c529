"""The KDA package's README: what it holds, how to use it, where every number comes from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_KINDS = (("decode", "recurrent", "fused_recurrent_kda"), ("prefill", "chunk", "chunk_kda"))


def readme(name: str, runs: Sequence[Any], cell_kernel: dict[str, dict[str, str]],
           provenance: dict[str, Any], parts: Any) -> str:
    """README.md of a package exported from a KDA run."""
    cells_table, install, measured, tests_and_bench = (parts.cells_table, parts.install, parts.measured,
                                                       parts.tests_and_bench)
    run = runs[0]
    templates = sorted({e.genome.template for e in run.entries})
    served = {kind: sorted(t for t in templates if t.startswith(prefix)) for kind, prefix, _ in _KINDS}
    lines = [
        f"# {name}",
        "",
        (f"Kimi Delta Attention (KDA) forward CUDA kernels found by Kernel Factory's search, exported from run "
         f"`{run.run['run_id']}`, built for `{run.arch}`, behind fla's (flash-linear-attention) two entry points. "
         "The package holds the rendered CUDA source and the cubin the search measured for every cell of the "
         "dispatch table, the templates they were rendered from (for shapes outside the table), a loader "
         "through cuda-python (cuda.core) and a float32 torch path for what the kernels do not compute."),
        "",
        *install("off-table K, V, variants and other GPUs"),
        "`import` needs neither a GPU nor torch (`explain`, `tables`, `provenance` read the shipped data).",
        "",
        "## Use",
        "",
        "```python",
        f"import torch, {name} as kf",
        "B, H, K, V = 64, 32, 128, 128",
        "q = torch.nn.functional.normalize(torch.randn(B, 1, H, K, device='cuda'), dim=-1).bfloat16()",
        "k = torch.nn.functional.normalize(torch.randn(B, 1, H, K, device='cuda'), dim=-1).bfloat16()",
        "v = torch.randn(B, 1, H, V, device='cuda', dtype=torch.bfloat16)",
        "g = torch.nn.functional.logsigmoid(torch.randn(B, 1, H, K, device='cuda'))  # fp32 log decay",
        "beta = torch.rand(B, 1, H, device='cuda').bfloat16()",
        "h0 = torch.zeros(B, H, K, V, device='cuda')",
        "o, ht = kf.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)",
        "print(kf.explain(q.shape, v.shape, q.dtype))   # which kernel this call gets, and why",
        "print(kf.stats())                               # calls per entry point and path in this process",
        "```",
        "",
        "- `fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,",
        "  output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,",
        "  use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None, state_v_first=False,",
        "  cu_seqlens=None) -> (o, final_state)`, as fla's: o [B, T, HV, V] in v's dtype, final_state fp32",
        "  [N, HV, K, V] ([N, HV, V, K] with `state_v_first`) or None. Out of place; an initial state of another",
        "  dtype is read as fp32.",
        "- `chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, ...,",
        "  cu_seqlens=None, **kwargs)` with fla's signature (A_log, dt_bias as keywords): runs the exported",
        "  prefill (chunk*) kernels. " + (f"This export has them: {', '.join(served['prefill'])}." if served["prefill"]
                                        else "**This export has none**: `chunk_kda` raises `MissingKernel` naming "
                                             "what is missing, rather than computing prefill another way."),
        "- Forward only: with grad enabled and an input that requires grad, a call takes the torch path (which",
        "  torch differentiates). fla keywords that change the result and are not implemented here",
        "  (`return_intermediate_states`, `cp_context`, continuous batching) raise NotImplementedError.",
        "",
        "## Which path a call takes (`explain`)",
        "",
        ("Each entry point launches its own templates: `fused_recurrent_kda` the decode ones (`recurrent*`: "
         f"{', '.join(served['decode']) or 'none exported'}), `chunk_kda` the prefill ones (`chunk*`: "
         f"{', '.join(served['prefill']) or 'none exported'}). A call is a cell of the factory's KDA op: its dims, "
         "its variant (gate, beta_act, qk_l2norm, v_first, from fla's keywords) and dtypes; a template's "
         "constraints refuse what it does not implement (the recurrent template: a gate computed in the kernel, "
         "a V-first state, cu_seqlens with several sequences, T > 64)."),
        "",
        "- `table`: a searched cell: the cubin the search measured there.",
        "- `table-build`: another B or T served by a prebuilt cubin (same genome, dtypes and compiled-in dims",
        "  K, V and variant); the factory's gate ran each cubin at B = 1, 3 and T = 3 as well.",
        "- `rerender`: the nearest searched genome whose template admits the call, rendered for it and",
        f"  compiled with NVRTC at first use (cached in `~/.cache/{name}`, `{name.upper()}_CACHE_DIR`).",
        "- `repaired`: the nearest genome with the fewest parameters changed so that its template admits it.",
        "- `torch`: float32 torch operations (`reference.kda`), correct but not searched: a variant or shape no",
        "  exported template admits, CPU tensors, mixed dtypes, headwise beta, inputs requiring grad, or a",
        "  kernel that failed to compile or check.",
        "- `missing`: `chunk_kda` in an export without a prefill template: an error, not a computation.",
        "",
        "Every kernel (the table's too) is checked against a float64 reference the first time it runs in each shape",
        "class: at the class's T (T itself up to 64, else 64 plus T mod 64; a decode batch's B likewise) on at",
        "most two sequences (three of a varlen batch) of random inputs, with the factory's tolerances; one that",
        "fails to compile or check is not used again in the process (a warning says why;",
        f"`{name.upper()}_SELFCHECK=0` turns the check off). Inside CUDA graph capture a class not yet checked",
        "takes the torch path: call once before capturing.",
        "",
        "## Cells (as measured by the search)",
        "",
        *cells_table(run),
        "",
        (f"{measured(run, provenance)} `source = replay` means recorded measurements replayed by the search, not "
         "a fresh GPU run."),
        "",
        *tests_and_bench(name, "fla's chunk_kda (default and safe_gate=True), fla's FlashKDA backend, "
                               "fused_recurrent_kda, cuDNN frontend's KDA and cuLA"),
        "The GPU tests compare every searched cell, off-table batches and head dims, every variant through the",
        "torch path, and fla's return convention with a float64 reference within the factory's tolerances.",
        "",
        "## Provenance",
        "",
        f"`{name}/data/provenance.json`: the run (config included), the fingerprints of the measurements, the",
        "factory commit and NVRTC used for the export; every evaluation of the run is in",
        f"`{name}/data/results/`. `{name}/data/dispatch.json` is the table the runtime reads.",
        "",
        "## Not covered",
        "",
        "- Variants the searched kernels do not compute run in float32 torch, token by token (slow for long T).",
        "- No backward kernels; no in-place final state or continuous batching (fla's ssm_state_indices).",
        "- One run per op is exported: a decode run and a prefill run of kda are two runs of one op, which the",
        "  exporter does not merge yet; a run that searched both kinds of template exports both.",
        "",
    ]
    return "\n".join(lines)
