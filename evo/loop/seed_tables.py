"""Seeds from dispatch tables: a run starts from the kernels an earlier run handed back (`dispatch.json`,
as `kfactory run` exports it and the results folders keep it), when the store it runs on does not hold
that run's evidence (a fresh store on a GPU machine, a store that lost a run). `[search] seed_tables`
names the files; per cell of this run, the fastest entry the tables recorded becomes a first-generation
genome (and every entry of a table of predictions, `"kind": "predictions"`, such as
`kfactory dispatch translate` writes: candidates no run has timed on that cell, seeded beside the
measured one), rebuilt from today's template text (parameters the template gained since take their defaults).
An entry outside this run (a cell it does not search, another template, a parameter the template no
longer has, a value the run's narrowed space leaves out) is skipped and counted, never bent into it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from evo.core.config import ConfigError
from evo.core.genome import Genome
from evo.templates.template import TemplateDef
from memory import queries as Q
from evo.core.spec import Cell


@dataclass(frozen=True)
class TableSeed:
    genome: Genome
    source: tuple[str, dict]  # (dtype key, dims) of the cell the entry served: where it is predicted fast


def _genome(op: str, templates: Mapping[str, TemplateDef], label: str, entry: dict,
            cells_by_label: Mapping[str, Cell], skip) -> Genome | None:
    """The entry as a genome of this run, or None (and `skip(reason)`) where it is outside the run."""
    if label not in cells_by_label:
        return skip("for cells not in this run")
    tdef = templates.get(entry["template"])
    if tdef is None:
        return skip("of templates not in this run")
    try:
        params = tdef.complete(entry["params"])
    except ValueError:
        return skip("with parameters the template no longer has")
    if any(params[p] not in vals for p, vals in tdef.space):
        return skip("outside this run's space")
    return Genome.make(op, tdef.name, tdef.source_hash, params)


@dataclass(frozen=True)
class TableSeeds:
    seeds: tuple[TableSeed, ...]
    skipped: Mapping[str, int]  # reason -> entries

    def describe(self, paths: Sequence[str]) -> str:
        why = ", ".join(f"{n} {r}" for r, n in sorted(self.skipped.items()))
        return (f"seed tables: {len(self.seeds)} genomes from {len(paths)} dispatch table(s)"
                + (f"; skipped {why}" if why else ""))


def _read(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"search.seed_tables: no such file: {path}")
    try:
        doc = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"search.seed_tables: {path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("dispatch"), dict):
        raise ConfigError(f"search.seed_tables: {path}: no 'dispatch' object (a run's dispatch.json)")
    return doc


def table_seeds(paths: Sequence[str], op: str, templates: Mapping[str, TemplateDef],
                cells_by_label: Mapping[str, Cell]) -> TableSeeds:
    """The first-generation genomes of the tables: for each of this run's cells (`cells_by_label`), the
    usable entry with the lowest recorded median over all the tables (the factory's own timings, each in its
    run: only a choice of where to start, the run times them again), all cells' before any prediction; then
    the usable entries of predictions tables, round by round over the cells (each cell's first prediction, in
    table order, then each cell's second, ...), each genome once. A population smaller than the seeds takes
    them in this order.
    Entries of cells not in this run are not used. Raises ConfigError naming the file for a missing or
    malformed table or entry."""
    skipped: dict[str, int] = {}

    def skip(reason: str) -> None:
        skipped[reason] = skipped.get(reason, 0) + 1
        return None

    best: dict[str, tuple[float, int, Genome]] = {}
    predicted: dict[str, list[Genome]] = {}
    for i, path in enumerate(paths):
        doc = _read(path)
        kind = doc.get("kind", "measurements")
        if kind not in ("measurements", "predictions"):
            raise ConfigError(f"search.seed_tables: {path}: kind {kind!r} is neither 'measurements' nor 'predictions'")
        for label, entry in doc["dispatch"].items():
            if not isinstance(entry, dict) or not isinstance(entry.get("params"), dict) \
                    or not isinstance(entry.get("template"), str):
                raise ConfigError(f"search.seed_tables: {path}: entry {label!r} has no template and params")
            g = _genome(op, templates, label, entry, cells_by_label, skip)
            if g is None:
                continue
            if kind == "predictions":
                predicted.setdefault(label, []).append(g)
                continue
            t = entry.get("median_us")
            rank = (float(t) if isinstance(t, (int, float)) and t > 0 else float("inf"), i)
            if label not in best or rank < best[label][:2]:
                best[label] = (*rank, g)
    # Order: every cell's measured best first, then the predictions, a cell's first ones before any cell's
    # second, so that a population smaller than the seeds still starts from each cell's measured best (a
    # cell with many predictions once pushed the other cells' bests past the first generation).
    order: list[tuple[str, Genome]] = [(label, best[label][2]) for label in sorted(best)]
    rounds = max((len(v) for v in predicted.values()), default=0)
    order += [(label, predicted[label][i]) for i in range(rounds) for label in sorted(predicted)
              if i < len(predicted[label])]
    seeds: dict[str, TableSeed] = {}
    for label, g in order:
        if g.key() not in seeds:
            cell = cells_by_label[label]
            seeds[g.key()] = TableSeed(g, (Q.dtype_key(cell.dtypes_dict()), cell.dims_dict()))
    return TableSeeds(tuple(seeds.values()), skipped)
