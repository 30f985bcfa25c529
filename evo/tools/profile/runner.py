"""Every target of a targets file under ncu, one process each: OUT/NAME.csv, OUT/NAME.log, and the summary."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from evo.tools.profile.ncu import ncu_command, parse_ncu_csv, summarize
from evo.tools.profile.targets import Target, plan


def _ncu(cmd: list[str], timeout_s: float) -> tuple[int, str, str]:
    """(returncode, stdout, stderr) of one ncu run; -1 with the reason when it did not start or ran too long."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        return p.returncode, p.stdout, p.stderr
    except (subprocess.TimeoutExpired, FileNotFoundError) as e:
        return -1, "", str(e)


def profile_target(t: Target, out_dir: Path, times: int, timeout_s: float) -> bool:
    """One target under ncu, again without the stall metrics where that fails; every attempt is logged to
    OUT/NAME.log; True when OUT/NAME.csv was written."""
    _, job, _ = plan(t)
    kernels = [lj.kernel for lj in job.launches]
    for stalls in (True, False):
        cmd = ncu_command(t, kernels, times, stalls)
        rc, stdout, stderr = _ncu(cmd, timeout_s)
        with (out_dir / f"{t.name}.log").open("a") as f:
            f.write(f"$ {' '.join(cmd)}\nrc={rc}\n{stderr[-4000:]}\n")
            if rc != 0:  # ncu writes its own errors (==ERROR==) to stdout
                f.write("".join(ln + "\n" for ln in stdout.splitlines() if ln.startswith("==")))
        if rc == 0 and parse_ncu_csv(stdout):
            (out_dir / f"{t.name}.csv").write_text(stdout)
            return True
    return False


def profile_targets(targets: list[Target], out_dir: Path, times: int = 2, timeout_s: float = 240,
                    say: Callable[[str], None] = print) -> int:
    """Every target under ncu; failures are logged, never fatal to the other targets; then the summary.
    Returns the number that produced a CSV."""
    out_dir.mkdir(parents=True, exist_ok=True)
    done = 0
    for t in targets:
        ok = profile_target(t, out_dir, times, timeout_s)
        done += ok
        say(f"profile {t.name}: {'ok' if ok else 'failed (see log)'}")
    summarize(out_dir)
    return done
