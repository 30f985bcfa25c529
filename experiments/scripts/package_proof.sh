#!/usr/bin/env bash
# The published numbers, rebuilt: an op's package exported from its committed store, installed, its own tests and its
# own benchmark run on this GPU. Each stage is bounded in time and skipped when already done (state in
# $KF_PROOF_STATE, default /tmp/kf_proof), so a sequence of calls resumes where the last stopped.
#
#   package_proof.sh wheels DIR...       install every wheel under DIR... (pieces NAME.whl.part.* joined first) into
#                                        $KF_SITE (default /tmp/kf_site), without the network
#   package_proof.sh export OP           unpack experiments/packages/OP.env's store, `kfactory export` its runs to
#                                        build/packages/OP (skipped when that folder exists)
#   package_proof.sh source DIR          build a peer that ships no wheel for this machine from source tarballs in DIR
#                                        (flashkda-*.tar.gz, with cutlass-*-headers.tar.gz: FlashKDA for sm_90a with
#                                        this machine's nvcc and torch) into $KF_SITE, without the network
#   package_proof.sh install OP          pip install build/packages/OP into $KF_SITE
#   package_proof.sh tests OP OUT        the package's own tests on this GPU -> OUT/OP_tests.log
#   package_proof.sh bench OP OUT TAG [ARGS...]   python -m NAME.bench ARGS -> OUT/OP_bench_TAG.json (and .log)
#   package_proof.sh all OUT [SECONDS] [OP...]     after export: every op's (default: every env file) install,
#                                        published benches (the env file's BENCHES: "TAG ARGS...", one table a
#                                        process) and tests, each one not done yet, until SECONDS (default 540) are
#                                        spent; call it again to go on where it stopped. OUT/OP/ holds each op's files
#   package_proof.sh --help              this text
#
# QuACK autotuned: each process reuses the choices QuACK's autotuner made on this card name before (a folder per card
# under $KF_PROOF_STATE/quack; $KF_QUACK_SEED, a tgz of it from an earlier machine, seeds it), recorded in each bench's
# environment.settings.
#
# Rebuilding a published table is: export, install, bench, with the commands written in its results folder
# (experiments/results/OP/CARD/commands.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
STATE=${KF_PROOF_STATE:-/tmp/kf_proof}
SITE=${KF_SITE:-/tmp/kf_site}
mkdir -p "$STATE" "$SITE"
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
# the CUTLASS DSL's .pth (its `cutlass` package under dsl_packages/, python_packages/ before 4.3) is not read from a
# --target install
for d in dsl_packages python_packages; do
  [ -d "$SITE/nvidia_cutlass_dsl/$d" ] && export PYTHONPATH="$PYTHONPATH:$SITE/nvidia_cutlass_dsl/$d"
done

# QuACK's autotuner keeps its choice per shape on disk when asked (QUACK_CACHE_AUTOTUNING=1), keyed by shape, dtype
# and QuACK's version but not by card: one folder per card name, so a later table's process (or a later machine of
# the same card, given $KF_QUACK_SEED, a tgz of $STATE/quack) takes the choice this card's own autotuning made. The
# benches record these settings with their results.
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -c 'A-Za-z0-9\n' '_' || true)
export QUACK_CACHE_AUTOTUNING=1 QUACK_HOME="$STATE/quack/${gpu:-no_gpu}"
if [ -n "${KF_QUACK_SEED:-}" ] && [ -f "$KF_QUACK_SEED" ] && [ ! -e "$STATE/quack/.seeded" ]; then
  mkdir -p "$STATE/quack" && tar xzf "$KF_QUACK_SEED" -C "$STATE/quack" && touch "$STATE/quack/.seeded"
fi

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "package_proof.sh: $*" >&2; exit 2; }
PACKAGES=${KF_PACKAGES:-experiments/packages}  # the ops' env files
env_of() { local f="$PACKAGES/$1.env"; [ -f "$f" ] || die "no package named $1 ($PACKAGES/*.env)"; . "$f"; }
done_mark() { [ -f "$STATE/$1.done" ]; }
mark() { touch "$STATE/$1.done"; }

stage=${1:-}
case "$stage" in
  -h|--help|"") usage; [ -n "$stage" ] || exit 2 ;;
  wheels)
    shift; [ $# -ge 1 ] || die "wheels DIR..."
    tmp=$(mktemp -d)
    for d in "$@"; do
      for w in "$d"/*.whl; do [ -e "$w" ] && cp "$w" "$tmp/"; done
      for first in "$d"/*.whl.part.aa; do
        [ -e "$first" ] || continue
        base=${first%.part.aa}; cat "$base".part.* > "$tmp/$(basename "$base")"
      done
    done
    n=$(ls "$tmp" | wc -l)
    [ "$n" -gt 0 ] || die "no wheels under $*"
    # into a fresh folder, then merged: pip --target does not add to a folder an earlier call made, and wheels
    # that share one (the CUTLASS DSL's libs and its core) may come in different calls
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$tmp/site" "$tmp"/*.whl
    python3 -c 'import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2], dirs_exist_ok=True)' "$tmp/site" "$SITE"
    echo "installed $n wheels into $SITE"; rm -rf "$tmp" ;;
  source)
    dir=${2:?source DIR}
    src=$(ls "$dir"/flashkda-*.tar.gz 2>/dev/null | head -1 || true)
    cut=$(ls "$dir"/cutlass-*-headers.tar.gz 2>/dev/null | head -1 || true)
    [ -n "$src" ] && [ -n "$cut" ] || die "source: $dir holds no flashkda-*.tar.gz and cutlass-*-headers.tar.gz"
    done_mark source_flashkda && { echo "source flashkda: done"; exit 0; }
    tmp=$(mktemp -d); mkdir -p "$tmp/src" "$tmp/bin"
    tar xzf "$src" -C "$tmp/src"; tar xzf "$cut" -C "$tmp/src"
    # its setup.py runs `git submodule update --init cutlass` first; the headers are unpacked already and this tree
    # is no repository, so that call is answered without git
    printf '#!/bin/sh\n[ "$1" = submodule ] && exit 0\nexit 1\n' > "$tmp/bin/git"; chmod +x "$tmp/bin/git"
    status=0
    PATH="$tmp/bin:$PATH" FLASH_KDA_CUDA_ARCHS=90a NVCC_THREADS=${NVCC_THREADS:-16} \
      python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" "$tmp/src" || status=$?
    rm -rf "$tmp"
    [ "$status" -eq 0 ] || die "source: FlashKDA did not build (pip exit $status)"
    python3 -c "import flash_kda; print('flash_kda', flash_kda.__file__)"; mark source_flashkda ;;
  export)
    op=${2:?export OP}; env_of "$op"
    out=build/packages/$op
    if [ -d "$out" ]; then echo "export $op: $out exists"; exit 0; fi
    mkdir -p build/stores
    gunzip -c "$STORE" > "build/stores/$op.duckdb"
    nvrtc=()
    if [ -n "${NVRTC:-}" ]; then  # the NVRTC that built the runs' cubins, when it is not this one
      dir=build/nvrtc-${NVRTC#*==}; dir=${dir%.\*}
      [ -d "$dir" ] || python3 -m pip install -q --no-deps --target "$dir" "$NVRTC"
      nvrtc=(--nvrtc "$dir")
    fi
    # shellcheck disable=SC2086
    python3 -m evo.cli.main export $RUNS --store "build/stores/$op.duckdb" --out "$out" --name "$NAME" "${nvrtc[@]}" ;;
  install)
    op=${2:?install OP}; env_of "$op"
    done_mark "install_$op" && { echo "install $op: done"; exit 0; }
    python3 -m pip install -q --no-deps --no-build-isolation --no-compile --target "$SITE" "build/packages/$op"
    mark "install_$op" ;;
  tests)
    op=${2:?tests OP OUT}; out=${3:?tests OP OUT}; env_of "$op"; mkdir -p "$out"
    done_mark "tests_$op" && { echo "tests $op: done"; exit 0; }
    (cd "build/packages/$op" && python3 -m pytest -q -rs tests) > "$out/${op}_tests.log" 2>&1 \
      && status=0 || status=$?
    tail -3 "$out/${op}_tests.log"; mark "tests_$op"; exit $status ;;
  bench)
    op=${2:?bench OP OUT TAG}; out=${3:?bench OP OUT TAG}; tag=${4:?bench OP OUT TAG}; shift 4; env_of "$op"
    mkdir -p "$out"; out=$(cd "$out" && pwd)
    done_mark "bench_${op}_$tag" && { echo "bench $op $tag: done"; exit 0; }
    (cd /tmp && python3 -m "$NAME.bench" --out "$out/${op}_bench_$tag.json" "$@") 2>&1 \
      | tee "$out/${op}_bench_$tag.log" | grep -v '^\s*$' | tail -n 60
    [ "${PIPESTATUS[0]}" -le 1 ] && mark "bench_${op}_$tag" ;;
  all)
    out=${2:?all OUT [SECONDS] [OP...]}; budget=${3:-540}; shift $(( $# < 3 ? $# : 3 ))
    [[ "$budget" =~ ^[0-9]+$ ]] || die "SECONDS must be a whole number, got $budget"
    ops=("$@")
    [ ${#ops[@]} -gt 0 ] || for f in "$PACKAGES"/*.env; do ops+=("$(basename "$f" .env)"); done
    end=$((SECONDS + budget))
    step() {  # step NAME COMMAND...: run it with the time left, or say where the next call goes on
      local left=$((end - SECONDS))
      if [ "$left" -lt 60 ]; then echo "all: ${left}s left; next: $1 (call again to go on)"; exit 0; fi
      timeout "$left" "${@:2}" || echo "all: $1 did not finish (exit $?)"
    }
    for op in "${ops[@]}"; do
      BENCHES=(); env_of "$op"
      done_mark "install_$op" || step "install $op" bash "$0" install "$op"
      for b in "${BENCHES[@]}"; do
        # shellcheck disable=SC2086
        set -- $b; done_mark "bench_${op}_$1" || step "bench $op $1" bash "$0" bench "$op" "$out/$op" "$@"
      done
      done_mark "tests_$op" || step "tests $op" bash "$0" tests "$op" "$out/$op"
    done
    echo "all: done" ;;
  *) die "unknown stage $stage (--help lists them)" ;;
esac
