"""The one record of an evaluation: what became of a genome on one cell.

The evaluators (GPU and replay) return it, results reused from the store and failure-memory
rejections are expressed in it, and the store writer, `kfactory bench`, the sweep and the loop read
it. The store's `evaluations` row and bench's CSV line are derived from it, never filled by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from evo.core.genome import Genome
from evo.core.status import Status
from evo.core.spec import Cell


@dataclass(frozen=True)
class Outcome:
    """One (genome, cell) evaluation; a failure has its Status and error text and an infinite time."""

    genome: Genome
    cell: Cell
    status: Status
    build_key: str = ""  # '' when nothing was built (rejected before the build)
    error: str = ""
    pattern: str = ""  # how it was wrong, short (clusters failures)
    median_us: float = math.inf
    p10_us: float = math.inf
    p90_us: float = math.inf
    samples: int = 0
    baseline_us: float = math.inf
    baseline: str = ""  # the baseline's name ('' = the op's first declared baseline)
    peers: tuple[tuple[str, float], ...] = ()  # median of every named baseline timed beside it, in order
    absent: tuple[tuple[str, str], ...] = ()  # baselines asked for that could not be had, and why
    peers_checked: tuple[tuple[str, str], ...] = ()  # timed baselines whose outputs matched the reference, and how
    graph: bool = False  # timed as a CUDA graph
    max_abs_err: float = math.nan
    rel_norm_err: float = math.nan
    reused_from: str = ""  # the run that measured it, when copied from another run's result
    replay: str = ""  # the job's secret draw and its gate cells (evo.measure.verify.replay_note): what replays it

    @property
    def timed(self) -> bool:
        """OK with a finite median: a time that may be ranked."""
        return self.status is Status.OK and math.isfinite(self.median_us)

    def pair(self) -> tuple[str, str]:
        """(genome key, cell label): what a run evaluates at most once."""
        return self.genome.key(), self.cell.label()
