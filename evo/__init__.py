"""Kernel Factory's engine (config, genomes, render, build, run, search, CLI) and its public Python API: the names
below are what scripts and notebooks may import (experiments/scripts/ use nothing else of `evo`). Each is loaded on
first use, so `import evo` costs nothing; the stage packages' modules are internal and may change without notice.
The command line (`kfactory`, evo/cli/main.py) is the other way in.

    from evo import build_point, get_op, load_templates
    cell = next(c for c in get_op("rmsnorm").matrix() if c.label() == "w=bf16,x=bf16 M4096-N2048")
    built = build_point(load_templates("rmsnorm")["cta_row"], {}, cell.dtypes_dict(), cell.dims_dict())
    print(built.status, dict(built.resources))  # OK, registers and spills of each kernel (NVRTC, no GPU)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module that defines it, by stage
_WHERE = {
    # ops, configs and genomes (evo/core)
    "get_op": "evo.core.registry", "load_config": "evo.core.config", "with_max_seconds": "evo.core.config",
    "Genome": "evo.core.genome", "gbps": "evo.core.spec",
    # templates and their spaces (evo/templates, evo/search)
    "load_templates": "evo.templates.template", "parse_template": "evo.templates.template",
    "sample": "evo.search.space", "enumerate_space": "evo.search.space",
    "failure_predictor": "evo.search.failure_memory",
    "GeneticSearch": "evo.search.strategy", "RandomSearch": "evo.search.strategy", "Observation": "evo.search.strategy",
    # builds (evo/build)
    "Builder": "evo.build.nvrtc", "BuildInput": "evo.build.nvrtc", "prepare": "evo.build.nvrtc",
    "build_point": "evo.build.nvrtc", "compiler_version": "evo.build.nvrtc",
    # the gate and the GPU worker (evo/measure)
    "Gate": "evo.measure.gate", "Worker": "evo.measure.worker", "GpuRunner": "evo.measure.run",
    "Timing": "evo.measure.jobs", "EvalItem": "evo.measure.evaluators", "GpuEvaluator": "evo.measure.evaluators",
    "RayBuilder": "evo.measure.ray_backend", "init_ray": "evo.measure.ray_backend",
    # a run's cells (evo/loop) and the commands behind `kfactory run` and `kfactory bench` (evo/cli)
    "cells_for": "evo.loop.pipeline", "dtype_sets": "evo.loop.pipeline",
    "run_config": "evo.cli.commands", "bench": "evo.cli.bench", "default_for_cell": "evo.cli.bench",
    # the gate by hand and host-time profiles (evo/tools)
    "hand_job": "evo.tools.hand_gate", "fresh_rng": "evo.tools.hand_gate",
    "host_times_us": "evo.tools.host_profile", "profile_rows": "evo.tools.host_profile",
    # the lesson store (memory/): read with SQL (memory/README.md)
    "Store": "memory.store",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'evo' has no attribute {name!r} (its public names: {', '.join(__all__)})")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from evo.build.nvrtc import Builder, BuildInput, build_point, compiler_version, prepare  # noqa: F401
    from evo.cli.bench import bench, default_for_cell  # noqa: F401
    from evo.cli.commands import run_config  # noqa: F401
    from evo.core.config import load_config, with_max_seconds  # noqa: F401
    from evo.core.genome import Genome  # noqa: F401
    from evo.core.registry import get_op  # noqa: F401
    from evo.core.spec import gbps  # noqa: F401
    from evo.loop.pipeline import cells_for, dtype_sets  # noqa: F401
    from evo.measure.evaluators import EvalItem, GpuEvaluator  # noqa: F401
    from evo.measure.gate import Gate  # noqa: F401
    from evo.measure.jobs import Timing  # noqa: F401
    from evo.measure.ray_backend import RayBuilder, init_ray  # noqa: F401
    from evo.measure.run import GpuRunner  # noqa: F401
    from evo.measure.worker import Worker  # noqa: F401
    from evo.search.failure_memory import failure_predictor  # noqa: F401
    from evo.search.space import enumerate_space, sample  # noqa: F401
    from evo.search.strategy import GeneticSearch, Observation, RandomSearch  # noqa: F401
    from evo.templates.template import load_templates, parse_template  # noqa: F401
    from evo.tools.hand_gate import fresh_rng, hand_job  # noqa: F401
    from memory.store import Store  # noqa: F401
