"""Checks an experiment config's tests share: every template of the run has legal points on every cell."""

from __future__ import annotations

import random
from collections.abc import Sequence

from evo.core.config import Config
from evo.core.spec import Cell
from evo.templates.template import load_templates


def legal_everywhere(c: Config, cells: Sequence[Cell], tries: int = 2000) -> None:
    """Each of the run's templates, restricted to its search space where the config gives one (else its whole
    space), has a legal point on each cell (random draws, seeded): AssertionError naming the template and the cell
    where none of `tries` draws is legal."""
    all_t = load_templates(c.run.op)
    for name in c.run.templates:
        space = c.search.space.get(name)
        tdef = all_t[name].restrict(space) if space else all_t[name]
        for cell in cells:
            rng = random.Random(0)
            assert any(tdef.is_valid({k: rng.choice(v) for k, v in tdef.space}, 90, cell.dtypes_dict(), cell.dims_dict())
                       for _ in range(tries)), (name, cell.label())
