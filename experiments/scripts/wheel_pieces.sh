#!/usr/bin/env bash
# For the peer stages (peers, fwdpeers, bwdpeers, respeers, quack: they install every wheel the folders bring;
# other stages carry .whl/ alone). Pack the GPU machine's wheels (.whl/ and the peers' .whl_peers/:
# experiments/scripts/gpu_wheels.sh) into
# folders .kfw_a/, .kfw_b/, ... that each fit one transfer to an offline GPU machine with the working tree
# (tracked and untracked-not-ignored files, ~15 MB), 64 MiB in all. Wheels over a folder's room are split (cat joins
# the pieces in name order:
# lab_gpu.sh joins nvidia_cutlass_dsl_libs_cu13's cu13.part.*). Prints the calls to send back to back
# (the machine keeps /tmp for 30 s after a command): every folder but the last with stage `stash`, the last
# with the stages that need the wheels.
# Usage, from the project root: bash experiments/scripts/wheel_pieces.sh [MARGIN_MB (1)]
set -euo pipefail
cd "$(dirname "$0")/../.."
margin=$(( ${1:-1} * 1024 * 1024 ))
limit=$(( 64 * 1024 * 1024 ))
tree=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null \
  | awk '{s += $1} END {print s + 0}')
room=$(( limit - tree - margin ))
[ "$room" -gt $(( 8 * 1024 * 1024 )) ] || { echo "the tree leaves $room bytes a call: too little" >&2; exit 1; }
rm -rf .kfw_*/
wheels=(.whl/*.whl .whl_peers/*.whl)
[ -e "${wheels[0]}" ] || { echo "no wheels: run experiments/scripts/gpu_wheels.sh first" >&2; exit 1; }
cu13=.whl_peers/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
tmp=$(mktemp -d)
items=()
for w in "${wheels[@]}"; do
  [ -e "$w" ] || continue
  if [ "$w" = "$cu13" ]; then  # too large for one call: pieces of at most a folder's room
    split -b "$room" -d -a 2 "$w" "$tmp/cu13.part."
    items+=("$tmp"/cu13.part.*)
  else
    items+=("$w")
  fi
done
# first fit, largest first
mapfile -t items < <(for f in "${items[@]}"; do echo "$(stat -c %s "$f") $f"; done | sort -rn | cut -d' ' -f2-)
used=()
n=0
for f in "${items[@]}"; do
  s=$(stat -c %s "$f")
  placed=
  for i in $(seq 0 $((n - 1))); do
    if [ $(( used[i] + s )) -le "$room" ]; then used[i]=$(( used[i] + s )); placed=$i; break; fi
  done
  if [ -z "$placed" ]; then used[n]=$s; placed=$n; n=$((n + 1)); fi
  d=.kfw_$(printf "\\x$(printf %x $((97 + placed)))")
  mkdir -p "$d"
  cp "$f" "$d/"
done
rm -rf "$tmp"
echo "tree $tree bytes, $room bytes a call; $n folders:"
for i in $(seq 0 $((n - 1))); do
  d=.kfw_$(printf "\\x$(printf %x $((97 + i)))")
  stage=stash; [ "$i" -eq $((n - 1)) ] && stage="STAGES"
  echo "  carry [\"$d\"]: bash experiments/scripts/lab_gpu.sh $stage \$OUT/x   ($(du -b -s "$d" | cut -f1) bytes)"
done
