import dataclasses
from pathlib import Path

import pytest

from evo.core.config import ConfigError, Runner, StrategyKind, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_experiment_parses():
    c = load_config(ROOT / "experiments" / "rmsnorm_h200.toml")
    assert c.run.op == "rmsnorm" and c.run.arch == "sm_90a" and c.run.runner is Runner.GPU
    assert c.search.strategy is StrategyKind.GA and c.build.workers >= 1


@pytest.mark.parametrize(
    "text, names",
    [
        ('[run]\nop = "rmsnorm"\nthreads = 3', "run.threads"),
        ('[run]\nop = 7', "run.op"),
        ('[run]\nop = "rmsnorm"\nseed = "zero"', "run.seed"),
        ('[run]\nop = "rmsnorm"\n[search]\npopulation = 1.5', "search.population"),
        ('[run]\nop = "rmsnorm"\n[search]\nstrategy = "annealing"', "search.strategy"),
        ('[run]\nop = "rmsnorm"\n[budget]\nmax_evals = 0', "budget.max_evals"),
        ('[run]\nop = "rmsnorm"\n[eval]\ncheck_sets = 1', "eval.check_sets"),
        ('[run]\nop = "rmsnorm"\n[bogus]\nx = 1', "bogus"),
        ('[run]\nop = "rmsnorm"\nrunner = "replay"', "run.replay_data"),
        ('[run]\nop = "rmsnorm"\narch = "hopper"', "run.arch"),
        ('[cells]\nmatrix = true', "run"),
        ('[run]\nop = "rmsnorm"\n[lessons]\nwarm_start = "yes"', "lessons.warm_start"),
        ('[run]\nop = "rmsnorm"\n[build]\nmax_spill_bytes = -2', "build.max_spill_bytes"),
    ],
    ids=["unknown-key", "wrong-type-str", "wrong-type-int", "float-for-int", "bad-enum", "range", "check-sets",
         "unknown-section", "replay-needs-data", "bad-arch", "missing-run", "bool", "spill-limit"],
)
def test_errors_name_the_key(text, names):
    with pytest.raises(ConfigError) as e:
        parse_config(text)
    assert names in str(e.value)


def test_missing_file_names_the_path(tmp_path):
    p = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="nope.toml"):
        load_config(p)


def test_invalid_toml_names_the_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[run\nop=")
    with pytest.raises(ConfigError, match="bad.toml"):
        load_config(p)


def test_config_is_frozen():
    c = parse_config('[run]\nop = "rmsnorm"')
    with pytest.raises(AttributeError):
        c.run.op = "kda"  # type: ignore[misc]


@pytest.mark.parametrize("spelling", ["compile", "none"])
def test_compile_runner_and_its_old_name_none_parse_alike(spelling):
    c = parse_config(f'[run]\nop = "rmsnorm"\nrunner = "{spelling}"')
    assert c.run.runner is Runner.COMPILE and c.run.runner.value == "compile"  # what ran is said as 'compile'


@pytest.mark.parametrize("text", ['[run]\nop = "rmsnorm"\n', '[run]\nop = "rmsnorm"\n[budget]\nmax_evals = 5\n[cells]\n',
                                  '[run]\nop = "rmsnorm"\n[budget]  # b\nmax_seconds = 60 # x\n'])
def test_max_seconds_is_set_in_the_config_and_its_text(text):
    """--max-seconds: without a [budget] table, with one lacking the key, with one holding it; the text parses to
    the config it came with (nothing else changed); no positive finite number of seconds is refused by name."""
    from evo.core.config import with_max_seconds

    c = parse_config(text)
    d = with_max_seconds(c, 12.5)
    assert d.budget.max_seconds == 12.5 and parse_config(d.source_text) == d
    assert dataclasses.replace(d, budget=c.budget) == c and d.config_hash != c.config_hash
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="--max-seconds"):
            with_max_seconds(c, bad)
