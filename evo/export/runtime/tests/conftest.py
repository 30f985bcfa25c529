"""Shared by the package's tests: the GPU tests skip, loudly, without a CUDA GPU."""

from __future__ import annotations


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "CUDA GPU" in str(r.longrepr)]
    if skipped:
        terminalreporter.write_line(f"WARNING: {len(skipped)} GPU test(s) skipped: no CUDA GPU visible to torch",
                                    yellow=True, bold=True)
