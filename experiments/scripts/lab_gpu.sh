#!/usr/bin/env bash
# The search runs, peer benches and profiles of experiments/*.toml on an offline Hopper GPU machine, in stages,
# from the project root (the published tables: experiments/scripts/package_proof.sh). Wheels: .whl/ holds
# experiments/gpu_wheels.txt's (experiments/scripts/gpu_wheels.sh); the peers' wheels
# (experiments/peer_wheels.txt) travel in .kfw/ in as many calls as the transfer limit needs, the
# ~92 MB CUTLASS DSL library wheel split into pieces (cu13.part.*, joined in name order), gathered in /tmp/kfw.
# experiments/scripts/wheel_pieces.sh packs every wheel into .kfw_a/, .kfw_b/, ... sized for the current tree
# and prints the commands to send one after the other.
#   ga OUT      device references of every op, the backward GA and the forward-regimes GA
#   bwdga OUT   the backward GA only (experiments/rmsnorm_bwd_h200.toml)
#   stash OUT   keep this call's .kfw/ pieces in /tmp/kfw for the next call
#   quack OUT   as peers, QuACK (heuristic and autotuned) alone
#   gallery OUT the adversarial galleries (RMSNorm forward and backward, KDA) through the gate, every cheat to be
#               rejected: gallery.json (experiments/scripts/gallery.py --no-controls, within $GALLERY_S seconds, 500)
#   gatecost OUT what gate 9's rounds cost an evaluation: the gate against itself without them, alternating, on RMSNorm
#               and KDA cells (experiments/scripts/gate_cost.py -> gate_cost.json, within $GATE_COST_S seconds, 500)
#   verify OUT  the GPU tests written without a GPU: device references (every op, RMSNorm's variants,
#               KDA), the worker, the exported packages; each file in a process of its own (a kernel that faults
#               ends its process's CUDA context, not the other files'), $VERIFY_FILES (default: all seven) within
#               $VERIFY_S seconds in all (540), each file's log in verify/NAME.log, its result line in the log
#   bwdall OUT  the backward GA over all 18 cells, no peer beside the candidates (rmsnorm_bwd_h200_all.toml)
#   residual OUT  the residual variant's GA (rmsnorm_residual_h200.toml)
#   bwdwide OUT the backward GA on the four widest 16-bit cells only (rmsnorm_bwd_h200_wide.toml)
#   bwdfp32 OUT the backward GA on the four fp32 cells only (rmsnorm_bwd_h200_fp32.toml), in the chain's store
#   bwdprefetch OUT  the backward GA of cluster_rows with and without prefetch on the 16-bit N = 4096 and the fp32
#               cells (rmsnorm_bwd_h200_prefetch.toml), in the chain's store; bwd_prefetch/prefetch.{md,json}: per cell the
#               fastest with each (kfactory evals compare); a later bwdpeers of the call merges its table
#   fwd2 OUT    the forward GA with the short-row template (rmsnorm_h200_regimes2.toml)
#   peers OUT   join and install the peers' wheels, then time every dispatch entry of the two GAs
#               against every peer in one process (kfactory bench --dispatch)
#   kda OUT     KDA: the decode GA (kda_decode_h200.toml) with fla's fused_recurrent_kda beside it
#   kdafocus OUT  KDA: the decode GA on B = 64 and 256 only, qkg = smem (kda_decode_h200_focus.toml), no peer
#               (fla-core from experiments/fla_wheels.txt in .whl/)
#   export OUT  the chain's fwdlong, residual (when run) and bwdall runs (one store) as one package (kfactory export), installed
#               with pip into a folder of its own, its tests run on this GPU (export/tests.log)
#   kdaflush OUT  KDA: both L2 flushes (read, then write) compared: the decode table
#               ($KDA_FLUSH_TABLE, default: the fastest per cell of this call's kdafocus run, if any, and
#               kda_decode_h200_5's) timed beside fla's fused_recurrent_kda under each (KF_L2_FLUSH), kdaflush/
#               (kda_decode_h200_8 is its output after kdafocus)
#   kdaexport OUT  KDA: a decode run and a prefill run exported as one package (kfactory export, MERGE): a prefill run
#               ($KDA_EXPORT_CONFIG, default kda_prefill_h200_best.toml: the best table's genomes measured again, one
#               generation; $KDA_EXPORT_GA_S seconds, 150) into a copy of a decode GA's store ($KDA_DECODE_STORE, default
#               build/kda_decode_store.duckdb, copied into build/) or, without one, beside a decode run of
#               $KDA_EXPORT_DECODE_CONFIG (default kda_decode_h200_best.toml, the same for decode's best table), or
#               $KDA_EXPORT_STORE holding both runs already; the
#               latest run of each exported, installed with pip into a folder of its own, its tests (kdaexport/tests.log;
#               $KDA_EXPORT_TESTS_S, 220, 0 skips them) and its bench (kdaexport/bench.json, fla beside, $KDA_EXPORT_BENCH_N
#               samples, 50, within $KDA_EXPORT_BENCH_S seconds, 400; $KDA_EXPORT_SPLIT set: --split, each call's GPU
#               and host shares too) on this GPU
#   kdahost OUT  KDA: the exported package's host time a Python call, per searched cell, and a cProfile of its calls
#               (experiments/scripts/kda_host_profile.py -> kda_host.json; $KDA_HOST_CALLS calls, 300, within $KDA_HOST_S
#               seconds, 200): the package of this call's kdaexport, else one exported from $KDA_EXPORT_STORE; with
#               $KDA_HOST_BASE (a folder holding an older checkout's evo/, ops/, templates/: git archive REV evo ops
#               templates | tar -x -C build/base) that code's package of the same store's runs first (kda_host_base.json)
#   kdacheck OUT  KDA: the chunk template at three points through the real gate on every prefill cell,
#               timed beside fla's chunk_kda (tests/gpu/test_kda_device.py -k chunk); when none passes,
#               a later kdaprefill stage of the call is skipped; $KDA_CHECK_K narrows the tests (pytest -k,
#               default "chunk"), $KDA_CHECK_S bounds them (300 s)
#   kdavarlen OUT  KDA: the varlen (cu_seqlens) GPU tests of both templates (tests/gpu/test_kda_device.py -k varlen)
#               within $KDA_VARLEN_S seconds (280), kdavarlen.log
#   kdavarlenga OUT  KDA: the GA on the varlen model-call cell (kda_varlen_h200.toml), its dispatch then timed
#               beside fla's chunk_kda given the same cu_seqlens
#   kdatimes OUT  KDA: each launch of the chunk template timed apart (tests/gpu/test_kda_launch_times.py),
#               rows in kda_launch_times.json; $KDA_TIMES_K narrows the points (pytest -k), $KDA_TIMES_S bounds them (120)
#   kdaprefill OUT  KDA: the chunked prefill GA ($KDA_PREFILL_CONFIG, default kda_prefill_h200.toml; GA_MAX_S + 60 s
#               or 240 s), then its dispatch timed against fla's chunk_kda in one process (kfactory bench --dispatch,
#               $KDA_PREFILL_BENCH_S seconds, 300: ~75 s a cell, fla's Triton JIT included)
#   kdabench OUT  KDA: a prefill dispatch table ($KDA_BENCH_TABLE, default kda_prefill_h200_17/dispatch_all4.json: the four
#               cells' best entries, merged) timed beside
#               fla's chunk_kda in one process within $KDA_BENCH_S seconds (400), kda_bench.{csv,md,json}; on a
#               fresh machine fla's Triton JIT takes ~90 s before the first entry is timed (kda_prefill_h200_16)
#   regate OUT  one genome or more through the full gate many times (kfactory regate; cases from
#               $REGATE_CASES, default experiments/regate/bwd_fp32_h100.json, within $REGATE_S seconds, 400):
#               is a rejection repeatable or rare? regate.json
#   profile OUT Nsight Compute (ncu --clock-control none) over $PROFILE_TARGETS' targets (default
#               experiments/profile_h200.toml) within $PROFILE_S seconds (540), each launched as the gate would:
#               profile/NAME.csv, summary.md (kfactory profile targets)
#   fwdlong OUT the forward GA on the N >= 4096 cells with cta_row and cta_row_async (rmsnorm_h200_long.toml)
#   rmsserve OUT  the RMSNorm package's GAs (forward, variants, training forward, backward), one after the other in
#               a copy of its committed store (experiments/results/rmsnorm/store.duckdb.gz, kept in /tmp/kf_rmsp for the
#               next call): $RMS_SERVE_CONFIGS (default: rmsnorm_h200_long rmsnorm_short rmsnorm_serving
#               rmsnorm_residual_h200 rmsnorm_residual_serving rmsnorm_train_rstd rmsnorm_bwd_nospill rmsnorm_bwd_train:
#               the training step's store_rstd cells, the spill-free backward and the step's other backward shapes
#               too), each with a budget of $RMS_SERVE_GA_S seconds (150, in place of its
#               config's max_seconds), its log in rmsserve/NAME.log; rmsserve/store.duckdb.gz
#               (the store to commit) and rmsserve/runs.txt (every run id and status: the package's RUNS)
#   kdaserve OUT  as rmsserve, the KDA GAs ($KDA_SERVE_CONFIGS, default: kda_prefill_h200 kda_prefill_long
#               kda_varlen_h200 kda_decode_h200) in a copy of the KDA package's committed store
#               (experiments/results/kda/store.duckdb.gz, kept in /tmp/kf_kdas), each within $KDA_SERVE_GA_S seconds
#               (150): kdaserve/store.duckdb.gz, runs.txt, NAME.log and learned_NAME.md (what each run learned, in SQL)
#   rmspackage OUT  the RMSNorm package exported from the chain's rmsserve store (the newest finished run of each
#               forward config; the newest rmsnorm_bwd_nospill run, else the committed backward run, and the newest
#               rmsnorm_bwd_train run where there is one; this machine's NVRTC), the peers' wheels of .kfw*/ installed,
#               then package_proof.sh all: install, the env file's published benches, the package's tests, within
#               $RMS_PKG_S seconds (500); a later call goes on where it stopped; rmspackage/ holds the env file used,
#               the package's dispatch.json, every bench's json and log, the tests' log and quack_autotune.tgz (QuACK's
#               autotuned choices on this card: KF_QUACK_SEED=that file reuses them, package_proof.sh --help)
#   rmshost OUT  the package of this chain's rmspackage export (installed by package_proof.sh install) timed layer by
#               layer on serving cells (experiments/scripts/rmsnorm_host_layers.py --bench-samples $RMS_HOST_SAMPLES,
#               200; $RMS_HOST_CALLS calls a layer, 2000): each layer's host time in a tight loop, a cProfile of the
#               API call, and every layer under the package bench's own timer (kernel, call, host; the latency after
#               the host returns): rmshost/host_layers.json and .log
#   kdapackage OUT  as rmspackage, the KDA package from the chain's kdaserve store (the newest finished run of each
#               kdaserve config, decode and prefill falling back to the committed "best" runs), within $KDA_PKG_S (500)
#   bwdpeers OUT  as peers, the backward only, on the cells matching $BWD_CELLS (a regular expression;
#               all when unset) within $BWD_PEERS_S seconds (150); fwdpeers OUT as peers, the forward only,
#               on the cells matching $FWD_CELLS within $FWD_PEERS_S seconds (280). QuACK autotuned
#               autotunes each cell on its first call (~18 s a forward cell: 21 cells took 370 s; one
#               backward cell took most of 170 s): 36 forward cells need ~2 calls. $BWD_PEERS names the
#               backward's peers (default "torch.eager liger quack quack.autotuned")
#   respeers OUT  as peers, the residual variant's dispatch (prenorm, residual_out) against torch eager,
#               torch.compile, QuACK and QuACK autotuned, cells matching $RES_CELLS within $RES_PEERS_S (200)
#   rmstrain OUT  RMSNorm in a training step: the package's committed runs ($RMS_TRAIN_RUNS, default
#               experiments/packages/rmsnorm.env's RUNS) of its committed store exported, installed with pip, its own tests
#               (rmstrain/tests.log, within $RMS_TRAIN_TESTS_S seconds, 200; 0 skips them), its bench --quick
#               (rmstrain/bench_quick.json: one cell per dtype and op, the training step's too), then
#               experiments/scripts/rmsnorm_train_step.py (rmstrain/train.json): forward + backward through autograd per
#               plain forward cell ($RMS_TRAIN_CELLS, a regular expression) beside torch eager, Liger (where .whl/ has
#               liger-kernel from experiments/peer_wheels.txt), torch.compile, and the package's former 3-pass rstd;
#               $RMS_TRAIN_SAMPLES samples (30), no new cell after $RMS_TRAIN_S seconds (240); with
#               $RMS_TRAIN_PARTS calls (100; 0: off) the host time of each part of the step and cProfiles (--host-parts)
# $GA_MAX_S, when set, is every GA's time budget in place of its config's budget.max_seconds.
# $KF_REQUIRE_GPU, when set (say H200), exits 3 at once, installing and running nothing, unless nvidia-smi's GPU name
# contains it (a shared pool may hand out another card than the one a stage was meant for), so
# `KF_REQUIRE_GPU=H200 bash ... kdabench OUT || other stages`.
# Several stages in one call: lab_gpu.sh "verify kda" OUT (they run in the order given).
set -uo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  sed -n '2,/^set -uo pipefail/{/^set -uo pipefail/d;s/^# \{0,1\}//;p}' "$0"
  exit 0
fi
stages=${1:?ga, gallery, gatecost, bwdga, bwdwide, bwdfp32, bwdprefetch, stash, peers, bwdpeers, fwdpeers, respeers, quack, verify, bwdall, fwd2, fwdlong, residual, kda, kdacheck, kdavarlen, kdavarlenga, kdatimes, export, profile, regate, kdaprefill, kdabench, kdahost, rmsserve, kdaserve, rmspackage, rmshost, kdapackage or rmstrain}; out=${2:?output folder}
if [ -n "${KF_REQUIRE_GPU:-}" ]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [[ "$gpu" == *"$KF_REQUIRE_GPU"* ]] || { echo "not a $KF_REQUIRE_GPU: ${gpu:-no GPU}; nothing run"; exit 3; }
fi
mkdir -p "$out" /tmp/kfw
root=$PWD
out=$(cd "$out" && pwd)  # absolute: stages run commands from other folders
for d in .kfw*/; do [ -d "$d" ] && cp "$d"* /tmp/kfw/; done
# fla's Triton kernels compile for ~90 s on a fresh machine (kda_prefill_h200_16; 12 s in the next process with the
# disk cache warm, kda_prefill_h200_17). A cache from an earlier call (any sm_90 GPU, the same triton), unpacked into
# .triton_cache/ ($KF_TRITON_SEED) and brought beside the tree, seeds TRITON_CACHE_DIR, and so does a packed one, $KF_TRITON_SEED.tgz
# (.triton_cache.tgz: fla's cache unpacked can exceed a call's transfer limit beside .whl/); KF_SAVE_TRITON_CACHE=1 packs
# the cache into $out/triton_cache.tgz when the script ends (to bring next time: cp .../triton_cache.tgz .triton_cache.tgz).
export TRITON_CACHE_DIR=${KF_TRITON_DIR:-/tmp/kf_triton}
mkdir -p "$TRITON_CACHE_DIR"
seed=${KF_TRITON_SEED:-.triton_cache}
[ -d "$seed" ] && cp -r "$seed"/. "$TRITON_CACHE_DIR"/
[ -f "$seed.tgz" ] && tar xzf "$seed.tgz" -C "$TRITON_CACHE_DIR"
save_triton() { [ "${KF_SAVE_TRITON_CACHE:-}" != 1 ] || tar czf "$out/triton_cache.tgz" -C "$TRITON_CACHE_DIR" .; }
trap save_triton EXIT
if [ "$stages" = stash ]; then ls -la /tmp/kfw; exit 0; fi
# pip --target skips the CUTLASS DSL's .pth file: put its packages folder on the path by hand
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD
if [[ " $stages " =~ " "(peers|bwdpeers|fwdpeers|respeers|quack)" " ]]; then
  whl=/tmp/kfw/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
  # joined by an earlier call of a back-to-back chain when its pieces are gone
  if compgen -G "/tmp/kfw/cu13.part.*" > /dev/null; then cat /tmp/kfw/cu13.part.* > "$whl" || exit 1; fi
  [ -s "$whl" ] || { echo "no CUTLASS DSL wheel: bring its pieces (.kfw*/)"; exit 1; }
  rm -f /tmp/kfw/cu13.part.*
  extra=(/tmp/kfw/*.whl)
else
  extra=()
fi
# a call after the first of a back-to-back chain may bring no .whl/: the first call's /tmp/site serves it
wheels=(.whl/*.whl "${extra[@]}")
[ -e "${wheels[0]}" ] || wheels=("${extra[@]}")
if [ ${#wheels[@]} -gt 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}" \
    || exit 1
fi
smi() { nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,driver_version --format=csv >> "$out/nvidia_smi.csv"; }
smi
log="$out/log.txt"
# ga SECONDS CONFIG STORE_DIR NAME: a GA run under a time limit, its exports in $out/NAME with its store
ga() {
  mkdir -p "$3"
  timeout "$1" python3 -m evo.cli.main run "$2" --store "$3/store.duckdb" ${GA_MAX_S:+--max-seconds "$GA_MAX_S"} \
    >> "$log" 2>&1
  echo "GA $4 ($2) rc=$?" >> "$log"
  mkdir -p "$out/$4"
  python3 -m evo.cli.main evals export latest "$out/$4/evaluations.parquet" --store "$3/store.duckdb" >> "$log" 2>&1
  cp "$(ls -t "$3"/runs/*/dispatch.json 2>/dev/null | head -1)" "$out/$4/dispatch.json" 2>/dev/null
  cp "$3/store.duckdb" "$out/$4/store.duckdb" 2>/dev/null
}
# kda_ga_bench GA_SECONDS CONFIG STORE_DIR NAME BENCH_SECONDS: a KDA chunk GA, then its dispatch timed beside
# fla's chunk_kda in one process ($out/NAME/peers)
kda_ga_bench() {
  ga "$1" "$2" "$3" "$4"
  local table
  table=$(ls -t "$3"/runs/*/dispatch.json 2>/dev/null | head -1)
  [ -n "$table" ] || return 0
  timeout "$5" python3 -m evo.cli.main bench --op kda --dispatch "$table" --peer fla.chunk_kda --timeout-s $(($5 - 10)) \
    --out "$out/$4/peers" >> "$log" 2>&1
  echo "$4 bench rc=$?" >> "$log"
}
# kda_package STORE [PKG SITE [CODE]]: the latest decode and prefill runs of a store exported as one package (PKG,
# default /tmp/kf_kpkg) by the factory in CODE (default this checkout), installed with pip into SITE (/tmp/kf_kpkg_site)
kda_package() {
  local ids pkg=${2:-/tmp/kf_kpkg} site=${3:-/tmp/kf_kpkg_site} code=${4:-$root}
  ids=$(python3 -c "import duckdb; c = duckdb.connect('$1', read_only=True); q = \"SELECT max(run_id) FROM runs WHERE run_id LIKE 'kda-%s%%'\"; print(*(c.execute(q % k).fetchone()[0] for k in ('decode', 'prefill')))")
  (cd "$code" && PYTHONPATH=/tmp/site:$code python3 -m evo.cli.main export $ids --store "$1" --out "$pkg") >> "$log" 2>&1
  echo "export $ids ($code) rc=$?" >> "$log"
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$site" "$pkg" >> "$log" 2>&1
  echo "package pip install rc=$?" >> "$log"
}
# store_runs NAME DIR STORE_GZ SECONDS CONFIG...: GAs one after the other in a copy of a committed store (kept in DIR
# for the next call of the chain), each with a budget of SECONDS in place of its config's max_seconds; NAME/CONFIG.log
# each run's log, NAME/learned_CONFIG.md what it learned (kfactory evals learned), NAME/store.duckdb.gz the store to
# commit, NAME/runs.txt every run id and status
store_runs() {
  local name=$1 dir=$2 gz=$3 seconds=$4 cfg run
  shift 4
  mkdir -p "$dir" "$out/$name"
  [ -e "$dir/store.duckdb" ] || gunzip -c "$gz" > "$dir/store.duckdb"
  for cfg in "$@"; do
    # the GA's own budget ends it (its last generation fitted to what is left, its tables written); the timeout,
    # 60 s later, only stops one that hangs
    timeout $((seconds + 60)) python3 -m evo.cli.main run "experiments/$cfg.toml" --store "$dir/store.duckdb" \
      --max-seconds "$seconds" > "$out/$name/$cfg.log" 2>&1
    echo "GA $cfg rc=$? ($(tail -1 "$out/$name/$cfg.log"))" >> "$log"
    run=$(grep -m1 -o "^run [^:]*" "$out/$name/$cfg.log" | cut -d' ' -f2)
    [ -n "$run" ] && python3 -m evo.cli.main evals export "$run" "/tmp/$run.parquet" --store "$dir/store.duckdb" \
      >> "$log" 2>&1 && python3 -m evo.cli.main evals learned "/tmp/$run.parquet" "$out/$name/learned_$cfg.md" >> "$log" 2>&1
  done
  gzip -c "$dir/store.duckdb" > "$out/$name/store.duckdb.gz"
  python3 -c "import duckdb, sys; c = duckdb.connect(sys.argv[1], read_only=True); [print(*r) for r in c.execute('SELECT run_id, status FROM runs ORDER BY created_at').fetchall()]" \
    "$dir/store.duckdb" > "$out/$name/runs.txt" 2>> "$log"
}
# package_from_store NAME OP STORE SECONDS IMPORTS RUN...: the OP package exported from a chain's store by
# package_proof.sh (its env file with this store, these runs and this machine's NVRTC, which built the new runs'
# cubins): RUN is a config's run name, its newest finished run taken ("A|B": A's where there is one, else B's); the
# peers' wheels of .kfw*/ (gathered in /tmp/kfw) installed once IMPORTS (a Python import line) works; then
# package_proof.sh all (install, the env file's benches, the tests) within SECONDS, resuming in a later call. NAME/
# holds the env file used, the package's dispatch.json, every bench's json and log, the tests' log and
# quack_autotune.tgz (QuACK's autotuned choices on this card)
package_from_store() {
  local name=$1 op=$2 store=$3 seconds=$4 imports=$5 runs
  shift 5
  [ -e "$store" ] || { echo "$name: no store in this chain ($store)" >> "$log"; return 0; }
  runs=$(python3 experiments/scripts/newest_runs.py "$store" "$@")
  echo "$name runs: $runs" >> "$log"
  mkdir -p /tmp/kf_pk "$out/$name"
  sed -e "s|^STORE=.*|STORE=/tmp/kf_pk/$op.duckdb.gz|" -e "s|^RUNS=.*|RUNS=\"$runs\"|" -e "s|^NVRTC=.*|NVRTC=|" \
    "experiments/packages/$op.env" > "/tmp/kf_pk/$op.env"
  [ -e "/tmp/kf_pk/$op.duckdb.gz" ] || gzip -c "$store" > "/tmp/kf_pk/$op.duckdb.gz"
  cp "/tmp/kf_pk/$op.env" "$out/$name/"
  if [ ! -d "build/packages/$op" ]; then  # a new export: what was installed, benched and tested was another
    KF_PACKAGES=/tmp/kf_pk bash experiments/scripts/package_proof.sh export "$op" >> "$log" 2>&1
    echo "$name export rc=$?" >> "$log"
    rm -rf "/tmp/kf_proof/install_$op.done" /tmp/kf_proof/bench_"$op"_*.done "/tmp/kf_proof/tests_$op.done" \
      /tmp/kf_site/kf_"$op"*
  fi
  cp "build/packages/$op/kf_$op/data/dispatch.json" "$out/$name/" 2>/dev/null
  if compgen -G "/tmp/kfw/*.whl*" > /dev/null && [ ! -e "/tmp/kf_proof/peers_$op.done" ]; then
    # done once the peers import: a wheel split into pieces installs nothing until its last piece has come
    bash experiments/scripts/package_proof.sh wheels /tmp/kfw >> "$log" 2>&1 \
      && PYTHONPATH=/tmp/kf_site:$PYTHONPATH:/tmp/kf_site/nvidia_cutlass_dsl/dsl_packages python3 -c "$imports" \
        >> "$log" 2>&1 && touch "/tmp/kf_proof/peers_$op.done"
    echo "$name peers' wheels rc=$?" >> "$log"
  fi
  if compgen -G "/tmp/kfw/*.whl*" > /dev/null && [ ! -e "/tmp/kf_proof/peers_$op.done" ]; then
    # a bench without the peers would publish them as absent: wait for the call that brings the last piece
    echo "$name: the peers' wheels did not install (pieces still to come?); no bench yet" >> "$log"
  else
    KF_PACKAGES=/tmp/kf_pk bash experiments/scripts/package_proof.sh all "$out/$name" "$seconds" "$op" >> "$log" 2>&1
    echo "$name all rc=$?" >> "$log"
  fi
  [ -d /tmp/kf_proof/quack ] && tar czf "$out/$name/quack_autotune.tgz" -C /tmp/kf_proof/quack --exclude .seeded .
  return 0
}
bwd_ga() {
  ga 300 experiments/rmsnorm_bwd_h200.toml /tmp/kf_bwd bwd
}
# RMSNorm's GAs of a chain (bwdall, fwdlong) share one store, so one export packages both runs; it starts
# as a copy of the committed bf16 backward run's store (its lessons, builds and results: a warm start)
rms_store() {
  [ -e /tmp/kf_rms/store.duckdb ] && return 0
  mkdir -p /tmp/kf_rms && gunzip -c tests/fixtures/results/rmsnorm_bwd_h200/store.duckdb.gz > /tmp/kf_rms/store.duckdb
}
# the peers benches time, per cell, the fastest entry recorded by this chain's GAs (where /tmp still has
# them) and the committed runs (kfactory dispatch merge --fastest; the bench then times it beside the peers)
peers_setup() {
  export QUACK_COMPILE_WORKERS=14
  python3 -c "import liger_kernel, quack; print('peers import')" >> "$log" 2>&1 || { tail -3 "$log"; return 1; }
  mkdir -p "$out/tables"
  fwd_long=$(ls -t /tmp/kf_rms/runs/rmsnorm-h200-long-*/dispatch.json 2>/dev/null | head -1)
  python3 -m evo.cli.main dispatch merge --fastest "$out/tables/fwd_dispatch.json" ${fwd_long:+"$fwd_long"} \
    tests/fixtures/results/rmsnorm_h200_long2/dispatch.json tests/fixtures/results/rmsnorm_h200_long/dispatch.json tests/fixtures/results/rmsnorm_h200_regimes/dispatch.json >> "$log" 2>&1
  bwd=$(ls -t /tmp/kf_rms/runs/rmsnorm-bwd-h200-all-*/dispatch.json 2>/dev/null | head -1)
  bwd_wide=$(ls -t /tmp/kf_rms/runs/rmsnorm-bwd-h200-wide-*/dispatch.json 2>/dev/null | head -1)
  bwd_fp32=$(ls -t /tmp/kf_rms/runs/rmsnorm-bwd-h200-fp32-*/dispatch.json 2>/dev/null | head -1)
  bwd_pf=$(ls -t /tmp/kf_rms/runs/rmsnorm-bwd-h200-prefetch-*/dispatch.json 2>/dev/null | head -1)
  python3 -m evo.cli.main dispatch merge --fastest "$out/tables/bwd_dispatch.json" ${bwd:+"$bwd"} ${bwd_wide:+"$bwd_wide"} \
    ${bwd_fp32:+"$bwd_fp32"} ${bwd_pf:+"$bwd_pf"} \
    experiments/seeds/rmsnorm_bwd_h200_wide.json tests/fixtures/results/rmsnorm_bwd_h200_all3/dispatch.json experiments/seeds/rmsnorm_bwd_h200_all2.json tests/fixtures/results/rmsnorm_bwd_h200/dispatch.json >> "$log" 2>&1
  res=$(ls -t /tmp/kf_rms/runs/rmsnorm-residual-h200-*/dispatch.json 2>/dev/null | head -1)
  python3 -m evo.cli.main dispatch merge --fastest "$out/tables/res_dispatch.json" ${res:+"$res"} \
    experiments/seeds/rmsnorm_residual_h200.json >> "$log" 2>&1
  echo "benching fwd ${fwd_long:-committed}, bwd ${bwd:-committed} ${bwd_wide:-} ${bwd_fp32:-} ${bwd_pf:-}, residual ${res:-committed} (fastest per cell)" >> "$log"
}
res_peers() {
  timeout "${RES_PEERS_S:-200}" python3 -m evo.cli.main bench --op rmsnorm --dispatch "$out/tables/res_dispatch.json" \
    ${RES_CELLS:+--cells "$RES_CELLS"} --peer torch.rms_norm --peer torch.compile --peer quack --peer quack.autotuned \
    --timeout-s 150 --out "$out/tables/res_peers" >> "$log" 2>&1
  echo "residual peers rc=$?" >> "$log"
}
bwd_peers() {
  timeout "${BWD_PEERS_S:-150}" python3 -m evo.cli.main bench --op rmsnorm_bwd --dispatch "$out/tables/bwd_dispatch.json" \
    ${BWD_CELLS:+--cells "$BWD_CELLS"} $(for p in ${BWD_PEERS:-torch.eager liger quack quack.autotuned}; do echo --peer "$p"; done) \
    --timeout-s 140 \
    --out "$out/tables/bwd_peers" >> "$log" 2>&1
  echo "bwd peers rc=$?" >> "$log"
}
fwd_peers() {
  timeout "${FWD_PEERS_S:-280}" python3 -m evo.cli.main bench --op rmsnorm --dispatch "$out/tables/fwd_dispatch.json" \
    ${FWD_CELLS:+--cells "$FWD_CELLS"} --peer torch.rms_norm --peer torch.compile --peer liger --peer quack \
    --peer quack.autotuned --timeout-s 200 --out "$out/tables/fwd_peers" >> "$log" 2>&1
  echo "fwd peers rc=$?" >> "$log"
}
for stage in $stages; do
case "$stage" in
  ga)
    timeout 120 python3 -m pytest -q -rs tests/gpu/test_op_device_reference.py >> "$log" 2>&1
    echo "device references rc=$?" >> "$log"
    bwd_ga
    ga 190 experiments/rmsnorm_h200_regimes.toml /tmp/kf_fwd fwd ;;
  bwdga) bwd_ga ;;
  gatecost)
    timeout "${GATE_COST_S:-500}" python3 experiments/scripts/gate_cost.py --out "$out/gate_cost.json" >> "$log" 2>&1
    echo "gate cost rc=$?" >> "$log" ;;
  gallery)
    timeout "${GALLERY_S:-500}" python3 experiments/scripts/gallery.py --no-controls --out "$out/gallery.json" \
      >> "$log" 2>&1
    echo "gallery rc=$?" >> "$log" ;;
  verify)
    mkdir -p "$out/verify"
    end=$((SECONDS + ${VERIFY_S:-540}))
    for f in ${VERIFY_FILES:-test_worker test_op_device_reference test_rmsnorm_variants_device test_export_gpu \
               test_peer_check test_export_kda_gpu test_kda_device}; do
      left=$((end - SECONDS))
      if [ "$left" -lt 10 ]; then echo "GPU tests $f: not run (time spent)" >> "$log"; continue; fi
      timeout "$left" python3 -m pytest -q -rs -p no:cacheprovider --durations=10 "tests/gpu/$f.py" \
        > "$out/verify/$f.log" 2>&1
      echo "GPU tests $f rc=$?: $(grep -E '(passed|failed|error)' "$out/verify/$f.log" | tail -1)" >> "$log"
    done ;;
  bwdall)  # warm: a copy of the bf16 run's store (its lessons, builds and results under the same fingerprint)
    rms_store
    ga 200 experiments/rmsnorm_bwd_h200_all.toml /tmp/kf_rms bwd_all ;;
  fwd2)
    ga 245 experiments/rmsnorm_h200_regimes2.toml /tmp/kf_fwd2 fwd2 ;;
  bwdwide)  # in the chain's shared store, warm from the backward runs there
    rms_store
    ga 200 experiments/rmsnorm_bwd_h200_wide.toml /tmp/kf_rms bwd_wide ;;
  bwdfp32)  # in the chain's shared store, warm from the backward runs there
    rms_store
    ga 220 experiments/rmsnorm_bwd_h200_fp32.toml /tmp/kf_rms bwd_fp32 ;;
  bwdprefetch)  # in the chain's shared store, warm from the backward runs there
    rms_store
    ga 230 experiments/rmsnorm_bwd_h200_prefetch.toml /tmp/kf_rms bwd_prefetch
    python3 -m evo.cli.main evals compare "$out/bwd_prefetch/evaluations.parquet" prefetch --template cluster_rows \
      --out "$out/bwd_prefetch/prefetch.json" > "$out/bwd_prefetch/prefetch.md" 2>> "$log"
    echo "prefetch compare rc=$?" >> "$log" ;;
  residual)  # in the chain's shared store, so that export packages the variant run beside the plain one
    rms_store
    ga 220 experiments/rmsnorm_residual_h200.toml /tmp/kf_rms residual ;;
  peers) peers_setup && bwd_peers && fwd_peers ;;
  bwdpeers) peers_setup && bwd_peers ;;
  respeers) peers_setup && res_peers ;;
  fwdpeers) peers_setup && fwd_peers ;;
  quack)
    export QUACK_COMPILE_WORKERS=14
    python3 -c "import importlib; importlib.import_module('quack.rmsnorm').rmsnorm_fwd; print('quack import')" >> "$log" 2>&1 \
      || { tail -3 "$log"; exit 1; }
    timeout 120 python3 -m evo.cli.main bench --op rmsnorm --dispatch tests/fixtures/results/rmsnorm_h200_regimes/dispatch.json \
      --peer quack --timeout-s 60 --out "$out/fwd_quack" >> "$log" 2>&1
    echo "fwd quack rc=$?" >> "$log"
    timeout 90 python3 -m evo.cli.main bench --op rmsnorm_bwd --dispatch tests/fixtures/results/rmsnorm_bwd_h200/dispatch.json \
      --peer quack --peer quack.autotuned --timeout-s 80 --out "$out/bwd_quack" >> "$log" 2>&1
    echo "bwd quack rc=$?" >> "$log"
    timeout 60 python3 -m evo.cli.main bench --op rmsnorm --dispatch tests/fixtures/results/rmsnorm_h200_regimes/dispatch.json \
      --cells 'x=bf16 M32768' --peer quack.autotuned --timeout-s 55 --out "$out/fwd_quack_tuned" >> "$log" 2>&1
    echo "fwd quack.autotuned rc=$?" >> "$log" ;;
  kda)
    python3 -c "import fla.ops.kda; print('fla import')" >> "$log" 2>&1
    ga 200 experiments/kda_decode_h200.toml /tmp/kf_kda kda_decode ;;
  kdafocus)  # the decode GA on B = 64 and 256 only, recurrent with qkg = smem (kda_decode_h200_focus.toml)
    ga 200 experiments/kda_decode_h200_focus.toml /tmp/kf_kdaf kda_decode_focus ;;
  kdaflush)
    mkdir -p "$out/kdaflush"
    table=${KDA_FLUSH_TABLE:-$out/kdaflush/dispatch_bench.json}
    if [ -z "${KDA_FLUSH_TABLE:-}" ]; then
      python3 -m evo.cli.main dispatch merge --fastest "$table" $(ls -t /tmp/kf_kdaf/runs/*/dispatch.json 2>/dev/null | head -1) \
        experiments/seeds/kda_decode_h200_5.json >> "$log" 2>&1
    fi
    for m in read write; do
      KF_L2_FLUSH=$m timeout 200 python3 -m evo.cli.main bench --op kda --dispatch "$table" --peer fla.fused_recurrent_kda \
        --timeout-s 180 --out "$out/kdaflush/bench_$m" > "$out/kdaflush/bench_$m.log" 2>&1
      echo "kda decode bench, $m flush, rc=$?" >> "$log"
    done ;;
  kdaexport)
    rm -rf /tmp/kf_kdax /tmp/kf_kpkg /tmp/kf_kpkg_site && mkdir -p /tmp/kf_kdax "$out/kdaexport"
    if [ -n "${KDA_EXPORT_STORE:-}" ]; then  # a store that holds both runs already (a kdaexport call's kda_prefill_x/)
      cp "$KDA_EXPORT_STORE" /tmp/kf_kdax/store.duckdb || { echo "kdaexport: no store $KDA_EXPORT_STORE" >> "$log"; continue; }
    else
      dstore=${KDA_DECODE_STORE:-build/kda_decode_store.duckdb}
      if [ -e "$dstore" ]; then
        cp "$dstore" /tmp/kf_kdax/store.duckdb
      else  # no decode store: the best decode table measured again as a run (a generation of its genomes)
        ga 200 "${KDA_EXPORT_DECODE_CONFIG:-experiments/kda_decode_h200_best.toml}" /tmp/kf_kdax kda_decode_x
      fi
      GA_MAX_S=${KDA_EXPORT_GA_S:-150} ga 220 "${KDA_EXPORT_CONFIG:-experiments/kda_prefill_h200_best.toml}" /tmp/kf_kdax kda_prefill_x
    fi
    kda_package /tmp/kf_kdax/store.duckdb
    if [ "${KDA_EXPORT_TESTS_S:-220}" != 0 ]; then
      (cd /tmp/kf_kpkg && PYTHONPATH=/tmp/kf_kpkg_site timeout "${KDA_EXPORT_TESTS_S:-220}" python3 -m pytest -q -rs tests) \
        > "$out/kdaexport/tests.log" 2>&1
      echo "package tests rc=$?" >> "$log"
    fi
    (cd /tmp && PYTHONPATH=/tmp/kf_kpkg_site:/tmp/site timeout "${KDA_EXPORT_BENCH_S:-400}" python3 -m kf_kda.bench \
      --samples "${KDA_EXPORT_BENCH_N:-50}" ${KDA_EXPORT_SPLIT:+--split} --out "$out/kdaexport/bench.json") \
      > "$out/kdaexport/bench.log" 2>&1
    echo "package bench rc=$?" >> "$log"
    cp /tmp/kf_kpkg/README.md "$out/kdaexport/" 2>/dev/null
    cp /tmp/kf_kpkg/kf_kda/data/dispatch.json /tmp/kf_kpkg/kf_kda/data/provenance.json "$out/kdaexport/" 2>/dev/null ;;
  kdahost)  # the host time of the package's Python calls and a cProfile of them (kda_host_profile.py), per cell;
    # the package of this call's kdaexport, else one exported from $KDA_EXPORT_STORE (no tests, no bench); with
    # $KDA_HOST_BASE (an older checkout's evo/, ops/, templates/), its package of the same runs too, profiled first
    if [ ! -d /tmp/kf_kpkg_site/kf_kda ]; then
      if [ -z "${KDA_EXPORT_STORE:-}" ]; then echo "kdahost: no package from kdaexport and no KDA_EXPORT_STORE" >> "$log"; continue; fi
      rm -rf /tmp/kf_kpkg /tmp/kf_kpkg_site
      kda_package "$KDA_EXPORT_STORE"
    fi
    sites=(/tmp/kf_kpkg_site)
    if [ -n "${KDA_HOST_BASE:-}" ] && [ -n "${KDA_EXPORT_STORE:-}" ]; then
      rm -rf /tmp/kf_kpkg_base /tmp/kf_kpkg_base_site
      kda_package "$KDA_EXPORT_STORE" /tmp/kf_kpkg_base /tmp/kf_kpkg_base_site "$(cd "$KDA_HOST_BASE" && pwd)"
      sites=(/tmp/kf_kpkg_base_site /tmp/kf_kpkg_site)
    fi
    for site in "${sites[@]}"; do
      name=kda_host$([ "$site" = /tmp/kf_kpkg_base_site ] && echo _base)
      (cd /tmp && PYTHONPATH=$site:/tmp/site:$root timeout "${KDA_HOST_S:-200}" python3 "$root/experiments/scripts/kda_host_profile.py" \
        "$out/$name.json" --calls "${KDA_HOST_CALLS:-300}") >> "$log" 2>&1
      echo "kda host profile $site rc=$?" >> "$log"
    done ;;
  kdacheck)
    timeout "${KDA_CHECK_S:-300}" python3 -m pytest -q -s -rs tests/gpu/test_kda_device.py -k "${KDA_CHECK_K:-chunk}" \
      > "$out/kdacheck.log" 2>&1
    echo "kda chunk check rc=$?" >> "$log"
    grep -qE ": OK | passed" "$out/kdacheck.log" || touch /tmp/kf_chunk_broken ;;
  fwdlong)
    rms_store
    ga 190 experiments/rmsnorm_h200_long.toml /tmp/kf_rms fwdlong ;;
  rmsserve)
    store_runs rmsserve /tmp/kf_rmsp experiments/results/rmsnorm/store.duckdb.gz "${RMS_SERVE_GA_S:-150}" \
      ${RMS_SERVE_CONFIGS:-rmsnorm_h200_long rmsnorm_short rmsnorm_serving rmsnorm_residual_h200 \
                           rmsnorm_residual_serving rmsnorm_train_rstd rmsnorm_bwd_nospill rmsnorm_bwd_train} ;;
  kdaserve)
    store_runs kdaserve /tmp/kf_kdas experiments/results/kda/store.duckdb.gz "${KDA_SERVE_GA_S:-150}" \
      ${KDA_SERVE_CONFIGS:-kda_prefill_h200 kda_prefill_long kda_varlen_h200 kda_decode_h200} ;;
  rmspackage)  # the RMSNorm package from the chain's rmsserve store, as package_proof.sh rebuilds a published one
    # the backward: the spill-free run where the chain made one, else the committed one
    # QuACK autotuned takes the choices its autotuner made on this card before (committed), where the card is one
    KF_QUACK_SEED=${KF_QUACK_SEED:-experiments/results/rmsnorm/h100/quack_autotune.tgz} \
    package_from_store rmspackage rmsnorm /tmp/kf_rmsp/store.duckdb "${RMS_PKG_S:-500}" \
      "import quack.rmsnorm, liger_kernel, cudnn" rmsnorm-h200-long rmsnorm-short rmsnorm-serving \
      rmsnorm-residual-h200 rmsnorm-residual-serving rmsnorm-train-rstd "rmsnorm-bwd-nospill|rmsnorm-bwd-h200-all" \
      rmsnorm-bwd-train ;;
  rmshost)  # where a serving call's time goes, on the package of this chain's rmspackage export
    mkdir -p "$out/rmshost"
    KF_PACKAGES=/tmp/kf_pk bash experiments/scripts/package_proof.sh install rmsnorm >> "$log" 2>&1
    echo "rmshost install rc=$?" >> "$log"
    PYTHONPATH=/tmp/kf_site:$PWD:$PYTHONPATH timeout "${RMS_HOST_S:-240}" python3 experiments/scripts/rmsnorm_host_layers.py \
      "$out/rmshost/host_layers.json" --calls "${RMS_HOST_CALLS:-2000}" --bench-samples "${RMS_HOST_SAMPLES:-200}" \
      > "$out/rmshost/host_layers.log" 2>&1
    echo "rmshost rc=$?" >> "$log" ;;
  kdapackage)  # the KDA package from the chain's kdaserve store: the new GA runs where the chain made them, else the
    # committed "best" runs
    package_from_store kdapackage kda /tmp/kf_kdas/store.duckdb "${KDA_PKG_S:-500}" "import fla.ops.kda" \
      "kda-decode-h200|kda-decode-h200-best" "kda-prefill-h200|kda-prefill-h200-best" kda-prefill-long \
      kda-varlen-h200 ;;
  kdavarlen)  # both KDA templates' cu_seqlens paths through the gate, the chunk one beside fla (fla's Triton JIT
    # of its varlen kernels comes first: the first call of 110 s ended before any test did)
    timeout "${KDA_VARLEN_S:-280}" python3 -m pytest -q -s -rs tests/gpu/test_kda_device.py -k varlen > "$out/kdavarlen.log" 2>&1
    echo "kda varlen rc=$?" >> "$log" ;;
  kdavarlenga)  # the varlen model-call cell's GA (kda_varlen_h200.toml), then its dispatch beside fla's chunk_kda
    kda_ga_bench 200 experiments/kda_varlen_h200.toml /tmp/kf_kdav kda_varlen 150 ;;
  kdatimes)
    KF_LAUNCH_TIMES_OUT="$out/kda_launch_times.json" timeout "${KDA_TIMES_S:-120}" python3 -m pytest -q -s -rs \
      tests/gpu/test_kda_launch_times.py ${KDA_TIMES_K:+-k "$KDA_TIMES_K"} > "$out/kdatimes.log" 2>&1
    echo "kda launch times rc=$?" >> "$log" ;;
  kdaprefill)
    if [ -e /tmp/kf_chunk_broken ]; then echo "kda prefill GA skipped: no chunk point passed kdacheck" >> "$log"; continue; fi
    kda_ga_bench $(( ${GA_MAX_S:-180} + 60 )) "${KDA_PREFILL_CONFIG:-experiments/kda_prefill_h200.toml}" /tmp/kf_kdap kda_prefill "${KDA_PREFILL_BENCH_S:-300}" ;;
  regate)
    timeout "${REGATE_S:-400}" python3 -m evo.cli.main regate "${REGATE_CASES:-experiments/regate/bwd_fp32_h100.json}" \
      --out "$out/regate.json" >> "$log" 2>&1
    echo "regate rc=$?" >> "$log" ;;
  kdabench)
    table=${KDA_BENCH_TABLE:-experiments/seeds/kda_prefill_h200_17_all4.json}
    timeout "${KDA_BENCH_S:-400}" python3 -m evo.cli.main bench --op kda --dispatch "$table" --peer fla.chunk_kda \
      --timeout-s $((${KDA_BENCH_S:-400} - 10)) --out "$out/kda_bench" >> "$log" 2>&1
    echo "kda bench $table rc=$?" >> "$log" ;;
  export)  # the chain's forward and backward runs as one package, installed with pip, its own tests on this GPU
    fwd_id=$(basename "$(dirname "$(ls -t /tmp/kf_rms/runs/rmsnorm-h200-long-*/dispatch.json 2>/dev/null | head -1)")")
    bwd_id=$(basename "$(dirname "$(ls -t /tmp/kf_rms/runs/rmsnorm-bwd-h200-all-*/dispatch.json 2>/dev/null | head -1)")")
    res_id=$(ls -t /tmp/kf_rms/runs/rmsnorm-residual-h200-*/dispatch.json 2>/dev/null | head -1)
    res_id=${res_id:+$(basename "$(dirname "$res_id")")}
    rm -rf /tmp/kf_pkg /tmp/kf_pkg_site && mkdir -p "$out/export"
    python3 -m evo.cli.main export $fwd_id $res_id $bwd_id --store /tmp/kf_rms/store.duckdb --out /tmp/kf_pkg >> "$log" 2>&1
    echo "export $fwd_id $res_id $bwd_id rc=$?" >> "$log"
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/kf_pkg_site /tmp/kf_pkg >> "$log" 2>&1
    echo "package pip install rc=$?" >> "$log"
    (cd /tmp/kf_pkg && PYTHONPATH=/tmp/kf_pkg_site timeout 150 python3 -m pytest -q -rs tests) > "$out/export/tests.log" 2>&1
    echo "package tests rc=$?" >> "$log"
    cp /tmp/kf_pkg/README.md "$out/export/" 2>/dev/null ;;
  rmstrain)  # the exported package's training step beside torch eager, Liger and torch.compile
    mkdir -p "$out/rmstrain" /tmp/kf_rt && rm -rf /tmp/kf_rtpkg /tmp/kf_rtpkg_site
    gunzip -c experiments/results/rmsnorm/store.duckdb.gz > /tmp/kf_rt/store.duckdb
    python3 -m evo.cli.main export ${RMS_TRAIN_RUNS:-$(. experiments/packages/rmsnorm.env && echo "$RUNS")} \
      --store /tmp/kf_rt/store.duckdb --out /tmp/kf_rtpkg >> "$log" 2>&1
    echo "rmstrain export rc=$?" >> "$log"
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/kf_rtpkg_site /tmp/kf_rtpkg >> "$log" 2>&1
    echo "rmstrain pip install rc=$?" >> "$log"
    if [ "${RMS_TRAIN_TESTS_S:-200}" != 0 ]; then
      (cd /tmp/kf_rtpkg && PYTHONPATH=/tmp/kf_rtpkg_site timeout "${RMS_TRAIN_TESTS_S:-200}" python3 -m pytest -q -rs tests) \
        > "$out/rmstrain/tests.log" 2>&1
      echo "rmstrain package tests rc=$?" >> "$log"
    fi
    (cd /tmp && PYTHONPATH=/tmp/kf_rtpkg_site timeout 120 python3 -m kf_rmsnorm.bench --quick --samples 10 \
      --out "$out/rmstrain/bench_quick.json") >> "$log" 2>&1
    echo "rmstrain package bench --quick rc=$?" >> "$log"
    PYTHONPATH=/tmp/kf_rtpkg_site:$PYTHONPATH timeout $((${RMS_TRAIN_S:-240} + 200)) python3 \
      experiments/scripts/rmsnorm_train_step.py "$out/rmstrain/train.json" --samples "${RMS_TRAIN_SAMPLES:-30}" --split \
      --compile --host-parts "${RMS_TRAIN_PARTS:-100}" ${RMS_TRAIN_CELLS:+--cells "$RMS_TRAIN_CELLS"} \
      --time-limit "${RMS_TRAIN_S:-240}" >> "$log" 2>&1
    echo "rmstrain train step rc=$?" >> "$log" ;;
  profile)  # Nsight Compute over $PROFILE_TARGETS' kernels (launched as the gate would)
    timeout "${PROFILE_S:-540}" python3 -m evo.cli.main profile targets \
      "${PROFILE_TARGETS:-experiments/profile_h200.toml}" "$out/profile" \
      >> "$log" 2>&1
    echo "profile rc=$?" >> "$log" ;;
  stash) ;;
  *) echo "unknown stage $stage" >> "$log" ;;
esac
done
smi
# a call brings back at most 8 files: each stage's folder travels as one archive
for d in "$out"/*/; do
  [ -d "$d" ] && tar czf "${d%/}.tgz" -C "$out" "$(basename "$d")" && rm -rf "$d"
done
tail -5 "$log"
