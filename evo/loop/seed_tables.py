"""Seeds from dispatch tables: a run starts from the kernels an earlier run handed back (`dispatch.json`,
as `kfactory run` exports it and the results folders keep it), when the store it runs on does not hold
that run's evidence (a fresh store on a GPU machine, a store that lost a run). `[search] seed_tables`
names the files; each entry whose template is in this run becomes a first-generation genome, rebuilt
from today's template text (parameters the template gained since take their defaults). An entry outside
this run's space (another template, a parameter the template no longer has, a value the run's narrowed
space leaves out) is skipped and counted, never bent into the space."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from evo.core.config import ConfigError
from evo.core.genome import Genome
from evo.templates.template import TemplateDef
from memory import queries as Q
from ops.spec import Cell


@dataclass(frozen=True)
class TableSeed:
    genome: Genome
    source: tuple[str, dict]  # (dtype key, dims) of the cell the entry served: where it is predicted fast


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
    """The first-generation genomes of the tables' entries (in table order, then cell order, each genome
    once), with where each came from. Raises ConfigError naming the file for a missing or malformed table
    or entry."""
    seeds: dict[str, TableSeed] = {}
    skipped: dict[str, int] = {}

    def skip(reason: str) -> None:
        skipped[reason] = skipped.get(reason, 0) + 1

    for path in paths:
        for label, entry in sorted(_read(path)["dispatch"].items()):
            if not isinstance(entry, dict) or not isinstance(entry.get("params"), dict) \
                    or not isinstance(entry.get("template"), str):
                raise ConfigError(f"search.seed_tables: {path}: entry {label!r} has no template and params")
            tdef = templates.get(entry["template"])
            if tdef is None:
                skip("of templates not in this run")
                continue
            params = dict(entry["params"])
            if set(params) - set(tdef.param_names):
                skip("with parameters the template no longer has")
                continue
            params = tdef.default_params() | params
            if any(params[p] not in vals for p, vals in tdef.space):
                skip("outside this run's space")
                continue
            g = Genome.make(op, tdef.name, tdef.source_hash, params)
            if g.key() in seeds:
                continue
            cell = cells_by_label.get(label)
            source = (Q.dtype_key(cell.dtypes_dict()), cell.dims_dict()) if cell is not None else ("", {})
            seeds[g.key()] = TableSeed(g, source)
    return TableSeeds(tuple(seeds.values()), skipped)
