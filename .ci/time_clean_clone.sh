#!/usr/bin/env bash
# Time CI as it runs: a clean clone of HEAD, `bash .ci/run` (install included), its wall time and its summary
# (the pytest result line and the 25 slowest tests) written to .ci/clean_clone_run.txt.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
git clone -q "$repo" "$work/clone"
cd "$work/clone"
start=$(date +%s)
bash .ci/run > "$work/out.txt" 2>&1
rc=$?
end=$(date +%s)
{
  echo "commit $(git rev-parse --short HEAD); $(nproc) cores; bash .ci/run on a clean clone: rc=$rc, $((end - start)) s wall (install included)"
  grep -v "^WARNING: Location" "$work/out.txt" | sed -n '/slowest 25 durations/,$p'
} > "$repo/.ci/clean_clone_run.txt"
cat "$repo/.ci/clean_clone_run.txt"
rm -rf "$work"
exit $rc
