"""What one generation produced, and the callbacks that see it (the loop's side effects live there)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from evo.core.genome import Genome
from evo.core.outcome import Outcome
from memory.rows import Row


@dataclass(frozen=True)
class Generation:
    """One pass of propose -> screen -> build -> measure; recorded whole, in one transaction."""

    number: int
    genomes: tuple[Genome, ...]  # built and measured: the strategy's that passed the screen, then the LLM's
    origins: Mapping[str, str]  # genome key -> 'init', 'search', 'warm', 'table' (a seed table's entry) or 'llm'
    rejected: tuple[Genome, ...]  # refused by failure memory, never built
    outcomes: tuple[Outcome, ...]  # measured or reused (reused_from set), in evaluation order
    rejections: tuple[Outcome, ...]  # the REJECTED outcomes of `rejected`, on every cell where legal
    rows: tuple[Row, ...]  # LLM calls and sources, then sources, candidates and builds, then the screen's uses
    elapsed_s: float  # search time spent when it was measured (the max_seconds budget, across resumes)

    @property
    def empty(self) -> bool:
        """Nothing proposed that was new: the search space is exhausted."""
        return not self.genomes and not self.rejected

    def bred(self) -> list[Genome]:
        """Genomes the strategy drew or bred (under priors, when on), not seeds or LLM children."""
        return [g for g in self.genomes if self.origins.get(g.key()) in ("init", "search")]


@dataclass(frozen=True)
class Callbacks:
    """The loop's side effects, hung off it (TVM's measure callbacks), called in this order."""

    credit: Callable[[Generation], list[Row]]  # lesson uses the generation earned, recorded with it
    record: Callable[[Generation, Sequence[Row]], None]  # the one writer: the generation in one transaction
    after: tuple[Callable[[Generation], None], ...]  # once the loop has learned: progress, lessons, snapshot
    dispatch: Callable[[str], None]  # at the end, with why it stopped: dispatch table, lessons, summary
