"""The KDA prep's hot loops in SASS (NVRTC builds, no GPU): kda_prefill_h200_13's dispatch genome (chunk 32, the mma
prep) at 128 and 256 prep threads, with the prep's exponentials as __expf (prep_exp fast) or one ex2.approx.ftz on a
base-2 decay (ex2), and its shared-memory offsets as swz of the flat offset or from row and column apart (prep_addr
rowcol), the last also with w, u by bf16 mma on ldmatrix fragments (prep_wu bf16), and that with every A block
factored at token 16 (prep_aref chunk, 128 threads only: its constraint); and at 128 threads the bf16 w, u prep with
v staged late (prep_v late: 6 CTAs an SM), alone and with the off-diagonal block's A_kk and A_qk on two warps
(prep_aoff two). Per build also the A phase's longest warp: each A loop's size times the k-steps one warp runs it
(K / 8 = 16 for the block loops, K / 16 = 8 for prep_aref chunk's). Per build: registers, the prep's
static instruction count, its innermost loops (evo/build/sass.py) and, for the loops that compute exponentials, their
role, instructions an exponential and an estimate of the warp-instructions a CTA spends in them (instructions an exponential x the warp-level exponentials a CTA computes in that role, from the
code at chunk 32, K = 128: q exp(G), k exp(G_last - G) and X = beta k exp(G) one a element, C K / 32 = 128 each; the
two diagonal blocks' k-steps 8 a lane and step, 2 x 16 x 8 = 256; the off-diagonal block's 16 x 8 = 128; prep_aref
chunk's k-step, 8 steps in each of 2 warps of 16 each, 256, in place of the two block loops, which only a wide chunk
runs then and the estimate leaves out; prep_aoff two's two off-diagonal loops, 128 each). The
decay's scan (no exponential) is counted as its body once a warp (K / prep_threads columns a thread: 1 at 128).

Run: python experiments/scripts/prep_sass.py OUT_JSON
With the H200 image's NVRTC 13.0 (pip install --no-deps --target /tmp/nvrtc130 "nvidia-cuda-nvrtc==13.0.*"):
KF_NVRTC_ALT=/tmp/nvrtc130 python experiments/scripts/prep_sass.py OUT_JSON
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from evo.build.nvrtc import Builder, build_point, prepare
from evo.build.sass import Loop, disassemble, inner_loops
from evo.core.genome import Genome
from evo.templates.template import load_templates
from ops.kda.spec import prefill_matrix

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = {"fast-swz": {"prep_exp": "fast", "prep_addr": "swz"}, "ex2-swz": {"prep_exp": "ex2", "prep_addr": "swz"},
            "fast-rowcol": {"prep_exp": "fast", "prep_addr": "rowcol"},
            "ex2-rowcol": {"prep_exp": "ex2", "prep_addr": "rowcol"},
            "ex2-rowcol-bf16wu": {"prep_exp": "ex2", "prep_addr": "rowcol", "prep_wu": "bf16"},
            "ex2-rowcol-bf16wu-arefchunk": {"prep_exp": "ex2", "prep_addr": "rowcol", "prep_wu": "bf16",
                                            "prep_aref": "chunk"},
            "ex2-rowcol-bf16wu-vlate": {"prep_exp": "ex2", "prep_addr": "rowcol", "prep_wu": "bf16", "prep_v": "late"},
            "ex2-rowcol-bf16wu-vlate-aofftwo": {"prep_exp": "ex2", "prep_addr": "rowcol", "prep_wu": "bf16",
                                                "prep_v": "late", "prep_aoff": "two"}}
# 128 prep threads only (their constraints)
ONLY_128 = {"ex2-rowcol-bf16wu-arefchunk", "ex2-rowcol-bf16wu-vlate", "ex2-rowcol-bf16wu-vlate-aofftwo"}
WARP_EXPS = {"qg": 128, "kgT": 128, "X": 128, "diagonal k-step": 256, "off-diagonal k-step": 128,
             "chunk-reference k-step": 256, "off-diagonal A_kk k-step": 128,
             "off-diagonal A_qk k-step": 128}  # chunk 32, K 128
A_STEPS = {"diagonal k-step": 16, "off-diagonal k-step": 16, "chunk-reference k-step": 8, "off-diagonal A_kk k-step": 16,
           "off-diagonal A_qk k-step": 16}  # k-steps one warp runs an A loop (K / 8; prep_aref chunk's K / 16)


def roles(loops: list[Loop]) -> dict[str, Loop]:
    """The loops the estimate needs, recognized in code order: the scan (32 shared loads, no exponential); q exp(G)
    and k exp(G_last - G) (exponentials and global stores, not one store an exponential as exp(G_last)'s loop);
    the diagonal and then the off-diagonal k-step (4 mma each); X (exponentials, no store, no shuffle: the exact
    fallback's loop has shuffles); w, u (32 mma)."""
    out: dict[str, Loop] = {}
    elementwise = []
    for lp in loops:
        mufu, hmma, stg = lp.count("MUFU"), lp.count("HMMA"), lp.count("STG")
        if hmma == 12:
            out.setdefault("chunk-reference k-step", lp)
        elif hmma == 2:  # prep_aoff two: A_kk's loop (warp 0) first in code order, then A_qk's (warp 3)
            out.setdefault("off-diagonal A_kk k-step", lp) if "off-diagonal A_kk k-step" not in out else out.setdefault(
                "off-diagonal A_qk k-step", lp)
        elif hmma == 4:
            out.setdefault("diagonal k-step", lp) if "diagonal k-step" not in out else out.setdefault(
                "off-diagonal k-step", lp)
        elif hmma >= 16:
            out.setdefault("w, u items", lp)
        elif mufu == 0 and lp.count("LDS") >= 32 and "scan" not in out:
            out["scan"] = lp
        elif mufu >= 8 and stg and stg != mufu and not lp.count("SHFL"):
            elementwise.append(lp)
        elif mufu >= 8 and not stg and not lp.count("SHFL"):
            out.setdefault("X", lp)
    for name, lp in zip(("qg", "kgT"), elementwise):
        out[name] = lp
    return out


def build(tdef, c, params: dict) -> dict:
    """One point built with this process's NVRTC, analysed."""
    try:
        r = build_point(tdef, params, c.dtypes_dict(), c.dims_dict())
    except ValueError as e:
        raise SystemExit(str(e)) from e
    return analyse(tdef, params, r)


def analyse(tdef, params: dict, r) -> dict:
    if not r.status.ok:
        raise SystemExit(f"{params}: {r.status.name} {r.error}")
    res = dict(r.resources)["kda_chunk_prep"]
    lines = disassemble(r.cubin, "kda_chunk_prep")
    loops = inner_loops(lines)
    found = roles(loops)
    est = {}
    wide_only = {"diagonal k-step", "off-diagonal k-step"} if "chunk-reference k-step" in found else set()
    for name, lp in found.items():
        if name in WARP_EXPS and name not in wide_only:
            per = lp.size / lp.count("MUFU")
            est[name] = {"instructions": lp.size, "exponentials": lp.count("MUFU"), "per_exponential": round(per, 2),
                         "warp_instructions_a_cta": round(per * WARP_EXPS[name])}
    scan = found.get("scan")
    if scan is not None:
        warps = params["prep_threads"] // 32
        est["scan"] = {"instructions": scan.size,
                       "warp_instructions_a_cta": scan.size * warps * 128 // params["prep_threads"]}
    return {"params": tdef.default_params() | params, "compiler": r.compiler, "regs": res.regs,
            "spill_stores": res.spill_stores, "stack_bytes": res.stack_bytes,
            "static_instructions": sum(1 for x in lines if not x.endswith(":")),
            "a_phase_longest_warp_instructions": max(found[n].size * k for n, k in A_STEPS.items()
                                                     if n in found and n not in wide_only),
            "roles": est, "wide_chunk_only_loops": {n: found[n].size for n in sorted(wide_only) if n in found}, "estimated_warp_instructions_a_cta": sum(v["warp_instructions_a_cta"] for v in est.values()),
            "w_u_loop_instructions": found["w, u items"].size if "w, u items" in found else None,
            "inner_loops": [{"first": lp.first, "size": lp.size, "MUFU": lp.count("MUFU"), "HMMA": lp.count("HMMA"),
                             "LDS": lp.count("LDS"), "STG": lp.count("STG"), "STS": lp.count("STS")} for lp in loops]}


def main(out: str) -> None:
    tdef = load_templates("kda")["chunk"]
    cells = prefill_matrix()
    table = json.loads((ROOT / "tests/fixtures/results/kda_prefill_h200_13/dispatch.json").read_text())["dispatch"]
    base = table[cells[0].label()]["params"]
    points = [(name, pt, base | {"prep_threads": pt} | over) for pt in (128, 256) for name, over in VARIANTS.items()
              if pt == 128 or name not in ONLY_128]
    alt = os.environ.get("KF_NVRTC_ALT")
    if alt:  # another NVRTC (the H200 image's 13.0: docs/nvrtc_13_0.md), in compile processes that load it
        c = cells[0]
        builder = Builder(2, nvrtc=alt)
        built = builder.build([prepare(tdef, Genome.make("kda", "chunk", tdef.source_hash, tdef.default_params() | p),
                                       "sm_90a", c.dtypes_dict(), c.dims_dict()) for _, _, p in points])
        results = [analyse(tdef, p, r) for (_, _, p), r in zip(points, built)]
    else:
        results = [build(tdef, cells[0], p) for _, _, p in points]
    rows = []
    for (name, pt, _), r in zip(points, results):
        rows.append({"variant": name, "prep_threads": pt, **r})
        print(f"{pt} threads {name}: {r['regs']} registers, {r['static_instructions']} static, estimated "
              f"{r['estimated_warp_instructions_a_cta']} warp-instructions a CTA in "
              + ", ".join(f"{k} {v['warp_instructions_a_cta']}" for k, v in r["roles"].items()))
    doc = {"what": __doc__.split("\n\n")[0], "compiler": results[0]["compiler"], "arch": "sm_90a",
           "cell": cells[0].label(),
           "base_genome": "kda_prefill_h200_13 dispatch of " + cells[0].label(), "builds": rows}
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "prep_sass.json")
