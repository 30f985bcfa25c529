"""README sections every op family's package README says alike (a family's `readme` in
`ops/<op>/export/readme.py` writes the rest): the table of searched cells, the install block, the
one-line summary of where a run's measurements come from, and the test and benchmark commands."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evo.export.runs import RunTable


def us(v: float | None) -> str:
    return f"{v:.2f}" if v is not None else "-"


def cells_table(run: RunTable) -> list[str]:
    """The run's searched cells as a Markdown table: kernel, its median, the baseline and the speedup."""
    lines = ["| cell | kernel | median us | baseline | baseline us | speedup |", "| --- | --- | --- | --- | --- | --- |"]
    for e in run.entries:
        lines.append(f"| {e.cell} | `{e.genome.short()}` | {us(e.median_us)} | {e.baseline or '-'} | "
                     f"{us(e.baseline_us)} | {f'{e.speedup:.3f}' if e.speedup else '-'} |")
    return lines


def install(nvrtc: str) -> list[str]:
    """## Install, with `nvrtc` saying what the NVRTC extra compiles (e.g. "off-table N and other GPUs ...")."""
    return [
        "## Install",
        "",
        "```bash",
        "pip install .                 # torch, numpy, jinja2, cuda-core, cuda-bindings, cuda-pathfinder",
        f"pip install '.[nvrtc]'        # plus NVRTC and CUDA headers: {nvrtc}",
        "pip install --no-build-isolation --no-deps .   # offline, with those already installed",
        "```",
        "",
    ]


def measured(run: RunTable, provenance: dict[str, Any]) -> str:
    """One sentence on a run's table: cells, where it comes from, what measured it, the geomean speedup
    (`provenance`: the export's provenance document)."""
    p = provenance["ops"][run.op]
    gm = p["geomean_speedup_vs_baseline"]
    return (f"{len(run.entries)} cells, table from {p['table_from']}, measured by {', '.join(p['sources'])} "
            f"(fingerprint classes {', '.join(p['fingerprint_classes']) or '-'}); geomean speedup over the baseline "
            f"timed beside each kernel {f'{gm:.3f}' if gm else '-'}.")


def tests_and_bench(name: str, versus: str) -> list[str]:
    """## Tests and benchmark: the commands, `versus` naming the peers the benchmark times the package against."""
    return [
        "## Tests and benchmark",
        "",
        "```bash",
        "pytest tests                     # tests/test_gpu.py skips, loudly, without a CUDA GPU",
        f"python -m {name}.bench --out bench.json   # the package vs every installed peer, one process",
        "```",
        "",
        f"The benchmark times the package's public calls against {versus} on every cell of the op's matrix, in one",
        "process, on the same inputs: every side's output is checked against a float64 reference first (a wrong or",
        "failing peer is reported, not timed; a peer not installed is reported absent with the reason), then the",
        "sides take turns sample by sample with the L2 flushed before each sample. Two columns per side: kernel",
        "time (the stream held so the host's time is hidden) and call time (what a Python caller waits on an idle",
        "GPU). The file records the card, clocks, driver, CUDA, NVRTC, torch, triton and every peer's version, the",
        "copy ceiling measured in the same process, and the path the package took on each cell (`--help`: tables,",
        "cells and peers to run).",
        "",
    ]


@dataclass(frozen=True)
class Parts:
    """The README parts every family's README uses, handed to the plug-in's `readme` (an op folder imports nothing
    from evo/export)."""

    cells_table: Callable[[Any], list[str]] = cells_table
    install: Callable[[str], list[str]] = install
    measured: Callable[[Any, dict[str, Any]], str] = measured
    tests_and_bench: Callable[[str, str], list[str]] = tests_and_bench


PARTS = Parts()
