"""Test-seconds by kind of cost, from a durations file (.ci/durations.tsv or .ci/durations_before.tsv), classified by test
file and name: python .ci/durations_by_kind.py .ci/durations.tsv"""
import re, sys, collections
def kind(t):
    f, _, name = t.partition("::")
    f = f.split("/")[-1]
    if f.startswith("test_ray"): return "Ray (local cluster, actors)"
    if f == "test_notebooks.py": return "notebooks (nbclient kernels)"
    if f.startswith("test_export") or f in ("test_rmsnorm_train_step.py",): return "exports, pip installs, nested pytest"
    if f in ("test_learn_in_search.py","test_search_replay.py","test_run_lifecycle.py","test_cli.py","test_build_reuse.py",
             "test_report.py","test_replay_golden.py","test_bench_peers.py","test_budget_pace.py","test_llm_in_search.py",
             "test_second_op.py","test_user_errors.py","test_llm_loop.py","test_warm_rerun_script.py","test_warm_vs_cold_script.py"):
        return "whole kfactory runs (replay searches)"
    if f in ("test_watchdog.py","test_store_live.py","test_multi_gpu.py","test_record.py","test_store.py"): return "subprocess and worker start-ups, stores"
    if re.search(r"compile|build|spill|sass|cubin|ldmatrix|shorten|instructions|fits_six", name) or f in ("test_sass.py","test_cubin.py","test_rows_smem_bwd.py","test_rows_bulk.py","test_regime_templates.py","test_cta_row_async.py","test_cta_row_l2.py","test_render_build.py","test_support_kernels.py","test_gallery_build.py","test_nvrtc_alt.py"):
        return "NVRTC compiles (and SASS reads)"
    if re.search(r"render|legal|legality|plans|smem|space|served|configs_hold|covers|offsets|pins|golden", name) or f in ("test_template_legal_points.py","test_space.py"):
        return "template sweeps (legality, plans, renders)"
    if re.search(r"emulat|fake_device|gate|margin|reference|fill|catches|perturb|launches", name) or f in ("test_gate.py","test_verify.py","test_rmsnorm_bwd_perturb.py","test_gate_kinds.py"):
        return "emulation, reference and gate on the numpy device"
    return "other"
rows=[]
for l in open(sys.argv[1]):
    if l.startswith("#"): continue
    s, ph, t = l.rstrip("\n").split("\t")
    rows.append((float(s), t))
tot=collections.Counter(); n=collections.Counter()
for s,t in rows: tot[kind(t)]+=s; n[kind(t)]+=1
all_=sum(tot.values())
for k,v in tot.most_common(): print(f"| {k} | {v:.0f} | {100*v/all_:.0f}% | {n[k]} |")
print("total", round(all_))
