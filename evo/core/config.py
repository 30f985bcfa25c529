"""Experiment TOML -> frozen, typed, validated dataclasses.

Every section is a dataclass; an unknown key, a wrong type or a missing file is a ConfigError naming
the key (as `section.key`) or the path. No live objects live in config. Paths in a config file
(`run.replay_data`) are relative to the file's folder.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import hashlib
import math
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from evo.core.llm_settings import LLMSettings


class ConfigError(ValueError):
    """A config file is missing, malformed, or has a bad key or value."""


class Runner(str, enum.Enum):
    GPU = "gpu"
    REPLAY = "replay"
    COMPILE = "compile"  # render and compile only, nothing evaluated: needs no GPU

    @classmethod
    def _missing_(cls, value: object) -> Runner | None:
        """'none', the compile runner's first name, still parses: older configs keep working."""
        return cls.COMPILE if value == "none" else None


class Backend(str, enum.Enum):
    LOCAL = "local"  # one worker process per visible GPU, a process pool for compiles
    RAY = "ray"  # GPU actors (num_gpus=1) and CPU compile tasks on a Ray cluster


class StrategyKind(str, enum.Enum):
    GA = "ga"
    RANDOM = "random"


@dataclass(frozen=True)
class RunSection:
    op: str
    name: str = ""
    arch: str = "sm_90a"
    seed: int = 0
    runner: Runner = Runner.GPU
    replay_data: str = ""
    templates: tuple[str, ...] = ()
    backend: Backend = Backend.LOCAL
    ray_address: str = ""  # empty: start a local Ray instance

    def __post_init__(self) -> None:
        if not self.arch.startswith("sm_") or not self.arch[3:].rstrip("a").isdigit():
            raise ConfigError(f"run.arch: {self.arch!r} is not an arch like 'sm_90a'")
        if self.runner is Runner.REPLAY and not self.replay_data:
            raise ConfigError("run.replay_data: required when run.runner = 'replay'")


@dataclass(frozen=True)
class CellsSection:
    """The cells to optimize: the op's full matrix, or a product of dtypes and dims."""

    matrix: bool | str = True  # true: the op's matrix; a name: one of the op's named matrices (OpSpec.matrices)
    dtypes: tuple[str, ...] = ()
    dims: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # a regular expression: only the cells whose label it finds (re.search) are optimized, say "N262144|N131072"
    # on labels like 'w=bf16,x=bf16 M8192-N262144'; "" keeps every cell
    only: str = ""

    def __post_init__(self) -> None:
        if self.only:
            try:
                re.compile(self.only)
            except re.error as e:
                raise ConfigError(f"cells.only: {self.only!r} is not a regular expression: {e}") from None
        if self.matrix == "":
            raise ConfigError("cells.matrix: true, false, or the name of one of the op's matrices")
        if not self.matrix and not (self.dtypes and self.dims):
            raise ConfigError("cells: set matrix = true (cells.dtypes then keeps only those dtypes), or give both "
                              "cells.dtypes and cells.dims")
        for k, vals in self.dims.items():
            if not vals or any(v < 1 for v in vals):
                raise ConfigError(f"cells.dims.{k}: must be a non-empty list of sizes >= 1")


@dataclass(frozen=True)
class SearchSection:
    strategy: StrategyKind = StrategyKind.GA
    population: int = 16
    elite: int = 4
    tournament: int = 3
    p_crossover: float = 0.5
    p_switch: float = 0.1
    max_template_share: float = 0.6
    # Optional narrowing of template spaces: space.<template>.<param> = [allowed values].
    space: Mapping[str, Mapping[str, tuple[Any, ...]]] = field(default_factory=dict)
    # Dispatch tables of earlier runs (dispatch.json) whose entries seed a fresh run's first generation
    # (evo.loop.seed_tables); relative to the config file's folder.
    seed_tables: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.population < 1:
            raise ConfigError("search.population: must be >= 1")
        if self.elite < 0:
            raise ConfigError("search.elite: must be >= 0")
        if self.tournament < 1:
            raise ConfigError("search.tournament: must be >= 1")
        for k in ("p_crossover", "p_switch", "max_template_share"):
            if not 0.0 <= getattr(self, k) <= 1.0:
                raise ConfigError(f"search.{k}: must be in [0, 1]")


@dataclass(frozen=True)
class BudgetSection:
    max_evals: int = 200
    max_seconds: float = 3600.0
    generations: int = 20
    patience: int = 5

    def __post_init__(self) -> None:
        for k in ("max_evals", "generations", "patience"):
            if getattr(self, k) < 1:
                raise ConfigError(f"budget.{k}: must be >= 1")
        if not self.max_seconds > 0:  # also refuses nan
            raise ConfigError(f"budget.max_seconds: must be > 0, got {self.max_seconds:g}")


@dataclass(frozen=True)
class BuildSection:
    workers: int = 2
    timeout_s: float = 60.0  # wall clock per NVRTC compile; past it the compile process is killed
    # a build whose kernels spill more bytes to local memory (stores or loads, per ptxas) is a RESOURCE_ERROR on
    # every cell of this run, never timed (the build itself is stored as compiled); -1: any spill is timed
    max_spill_bytes: int = -1

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError("build.workers: must be >= 1")
        if self.max_spill_bytes < -1:
            raise ConfigError(f"build.max_spill_bytes: must be >= 0, or -1 for no limit; got {self.max_spill_bytes}")
        if not 0 < self.timeout_s < float("inf"):
            raise ConfigError("build.timeout_s: must be > 0 and finite")


@dataclass(frozen=True)
class EvalSection:
    timeout_s: float = 60.0
    check_sets: int = 3
    min_samples: int = 100
    max_samples: int = 400
    warmup: int = 10
    # Time the op's first baseline beside every candidate (its speedup in the store and the dispatch
    # table). false: rank by the candidate's own time only, roughly twice the evaluations per second
    # where the baseline is slow (torch's autograd of a backward), and time the peers afterwards on the
    # dispatch table with `kfactory bench --dispatch`.
    baseline: bool = True

    def __post_init__(self) -> None:
        if self.check_sets < 3:
            raise ConfigError("eval.check_sets: must be >= 3 (fresh random input sets per cell)")
        if self.min_samples < 100:
            raise ConfigError("eval.min_samples: must be >= 100")
        if not 0 < self.timeout_s < math.inf:
            raise ConfigError("eval.timeout_s: must be > 0 and finite")
        if self.max_samples < self.min_samples:
            raise ConfigError("eval.max_samples: must be >= eval.min_samples")
        if self.warmup < 0:
            raise ConfigError("eval.warmup: must be >= 0")


@dataclass(frozen=True)
class LessonsSection:
    warm_start: bool = True
    failure_memory: bool = True
    priors: bool = True
    # Where a warm start's prediction for a cell misses, poll the neighbourhood of the cell's best there.
    refine: bool = True


@dataclass(frozen=True)
class LLMSection(LLMSettings):
    """The LLM mutation operator: the client settings (evo.core.llm_settings; model = "none" turns it off;
    keys come only from the environment) and what the search loop does with it."""

    proposals_per_generation: int = 2
    prompt_lessons: int = 5
    prompt_failures: int = 5
    replay_run: str = ""  # answer from this run's stored llm_calls (by prompt hash) instead of the network

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ValueError as e:
            raise ConfigError(str(e)) from None
        for k in ("proposals_per_generation", "prompt_lessons", "prompt_failures"):
            if getattr(self, k) < 0:
                raise ConfigError(f"llm.{k}: must be >= 0")


@dataclass(frozen=True)
class Config:
    run: RunSection
    cells: CellsSection = CellsSection()
    search: SearchSection = SearchSection()
    budget: BudgetSection = BudgetSection()
    build: BuildSection = BuildSection()
    eval: EvalSection = EvalSection()
    lessons: LessonsSection = LessonsSection()
    llm: LLMSection = LLMSection()
    source_text: str = field(default="", compare=False, repr=False)
    path: str = field(default="", compare=False)  # the file it was read from (absolute), "" for text

    @property
    def base_dir(self) -> Path:
        """The folder relative paths in the config are resolved against."""
        return Path(self.path).parent if self.path else Path.cwd()

    @property
    def config_hash(self) -> str:
        return hashlib.sha256(self.source_text.encode()).hexdigest()[:16]


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check (and gently convert: list -> tuple, int -> float, str -> Enum) one value."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise ConfigError(f"{where}: {value!r} is not one of {[m.value for m in tp]}") from None
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = {a for a in typing.get_args(tp) if a is not Ellipsis}
        return tuple(_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (dict, collections.abc.Mapping):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {type(value).__name__}")
        _, vt = typing.get_args(tp)
        return types.MappingProxyType({k: _coerce(v, vt, f"{where}.{k}") for k, v in value.items()})
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if isinstance(tp, types.UnionType) and all(a in (str, bool) for a in typing.get_args(tp)):
        if type(value) not in typing.get_args(tp):
            names = " or ".join(a.__name__ for a in typing.get_args(tp))
            raise ConfigError(f"{where}: expected {names}, got {type(value).__name__} {value!r}")
        return value
    if tp in (str, bool):
        if type(value) is not tp:
            raise ConfigError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported type {tp}")


def _section(cls: type, table: Any, name: str) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(f"{name}: expected a table")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(f"{name}.{unknown[0]}: unknown key (known: {sorted(fields)})")
    kwargs = {}
    for k, f in fields.items():
        if k in table:
            kwargs[k] = _coerce(table[k], hints[k], f"{name}.{k}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{name}.{k}: missing required key")
    return cls(**kwargs)


def parse_config(text: str, origin: str = "<string>", path: str | Path = "") -> Config:
    """Parse experiment TOML text; errors name the key. With `path` (the file the text came from),
    relative paths in it are taken relative to that file's folder, else to the working directory."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{origin}: not valid TOML: {e}") from None
    hints = typing.get_type_hints(Config)
    sections = {f.name for f in dataclasses.fields(Config)} - {"source_text"}
    unknown = sorted(set(doc) - sections)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section (known: {sorted(sections)})")
    if "run" not in doc:
        raise ConfigError("run: missing required section")
    kwargs = {k: _section(hints[k], doc[k], k) for k in sections if k in doc}
    where = Path(path).resolve() if path else None
    run = kwargs["run"]
    if run.replay_data and where is not None and not Path(run.replay_data).is_absolute():
        kwargs["run"] = dataclasses.replace(run, replay_data=os.path.normpath(where.parent / run.replay_data))
    search = kwargs.get("search")
    if search is not None and search.seed_tables and where is not None:
        kwargs["search"] = dataclasses.replace(search, seed_tables=tuple(
            t if Path(t).is_absolute() else os.path.normpath(where.parent / t) for t in search.seed_tables))
    return Config(**kwargs, source_text=text, path=str(where) if where else "")


def load_config(path: str | Path) -> Config:
    """Read and parse an experiment file; its relative paths are relative to its folder."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}" if not p.exists() else f"config {p}: not a file")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config {p}: not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r})") from None
    except OSError as e:
        raise ConfigError(f"config {p}: cannot be read: {e.strerror}") from None
    return parse_config(text, str(p), p)


def with_max_seconds(config: Config, seconds: float) -> Config:
    """`config` with budget.max_seconds set to `seconds`, in its text too: the run records (and a resume reads) the
    budget it ran under, not the file's. The edited text is parsed again and must give the same config but for it."""
    if not seconds > 0 or math.isinf(seconds):
        raise ConfigError(f"--max-seconds: must be a positive number of seconds, got {seconds:g}")
    lines = config.source_text.splitlines()
    line = f"max_seconds = {seconds!r}  # set by --max-seconds"
    header = next((i for i, s in enumerate(lines) if re.fullmatch(r"\s*\[\s*budget\s*\]\s*(#.*)?", s)), None)
    if header is None:
        lines += ["", "[budget]", line]
    else:
        end = next((i for i in range(header + 1, len(lines)) if re.match(r"\s*\[", lines[i])), len(lines))
        at = next((i for i in range(header + 1, end) if re.match(r"\s*max_seconds\s*=", lines[i])), None)
        if at is None:
            lines.insert(header + 1, line)
        else:
            lines[at] = line
    text = "\n".join(lines) + "\n"
    out = parse_config(text, config.path or "<string>", config.path)
    if out.budget.max_seconds != seconds or dataclasses.replace(out, budget=config.budget) != config:
        raise ConfigError(f"--max-seconds: the config's text could not be given budget.max_seconds = {seconds:g}")
    return out
