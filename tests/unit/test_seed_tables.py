"""Seeds from dispatch tables (`[search] seed_tables`): per cell of the run, the fastest recorded entry of
the tables starts a fresh run's first generation, rebuilt from today's templates; entries outside the run
are skipped and counted; a missing or malformed table is a ConfigError naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evo.cli.main import main
from evo.core.config import ConfigError, parse_config
from evo.core.genome import Genome
from evo.loop.seed_tables import table_seeds
from evo.templates.template import load_templates
from memory.store import Store
from ops.rmsnorm import SPEC
from tests.unit.test_search_replay import SMALL

ROOT = Path(__file__).resolve().parents[2]
LONG = ROOT / "tests/fixtures/results/rmsnorm_h200_long/dispatch.json"  # cta_row and cta_row_async entries


def _cells():
    return {c.label(): c for c in SPEC.all_cells()}


def test_a_committed_table_seeds_each_distinct_genome_once_with_its_cell():
    t = load_templates("rmsnorm")
    table = json.loads(LONG.read_text())["dispatch"]
    got = table_seeds([str(LONG)], "rmsnorm", {k: t[k] for k in ("cta_row", "cta_row_async")}, _cells())
    want = {(e["template"], json.dumps(t[e["template"]].default_params() | e["params"], sort_keys=True))
            for e in table.values()}
    assert {(s.genome.template, json.dumps(s.genome.params_dict(), sort_keys=True)) for s in got.seeds} == want
    assert len(got.seeds) == len(want) < len(table)  # a genome serving several cells is seeded once
    assert not got.skipped
    for s in got.seeds:  # each seed's source is a cell it served, as (dtype key, dims)
        served = [label for label, e in table.items() if e["template"] == s.genome.template
                  and t[s.genome.template].default_params() | e["params"] == s.genome.params_dict()]
        assert any(_cells()[label].dims_dict() == s.source[1] for label in served)


def test_entries_outside_the_run_are_skipped_and_counted(tmp_path):
    t = load_templates("rmsnorm")
    narrowed = t["cta_row"].restrict({"threads": (128,)})
    got = table_seeds([str(LONG)], "rmsnorm", {"cta_row": narrowed}, _cells())
    table = json.loads(LONG.read_text())["dispatch"]
    n_async = sum(e["template"] == "cta_row_async" for e in table.values())
    n_wide = sum(e["template"] == "cta_row" and e["params"]["threads"] != 128 for e in table.values())
    assert got.skipped.get("of templates not in this run") == n_async > 0
    assert got.skipped.get("outside this run's space") == n_wide > 0
    assert all(s.genome.params_dict()["threads"] == 128 for s in got.seeds)
    odd = tmp_path / "odd.json"
    label = next(iter(table))
    odd.write_text(json.dumps({"dispatch": {label: {"template": "cta_row", "params": {"threads": 128, "tiles": 3}},
                                            "w=bf16,x=bf16 M3-N5": {"template": "cta_row", "params": {}}}}))
    got = table_seeds([str(odd)], "rmsnorm", {"cta_row": t["cta_row"]}, _cells())
    assert not got.seeds
    assert got.skipped == {"with parameters the template no longer has": 1, "for cells not in this run": 1}
    assert "skipped 1 for cells not in this run, 1 with parameters the template no longer has" in \
        got.describe([str(odd)])


def test_per_cell_the_fastest_usable_entry_of_all_tables_wins(tmp_path):
    """Two tables on two cells: the faster entry per cell wins whichever table holds it, an entry of a
    template not in the run never wins (the next fastest does), an entry without a time ranks last, and
    cells not in the run give nothing."""
    t = load_templates("rmsnorm")
    run = {k: t[k] for k in ("cta_row", "warp_row")}
    a, b = "w=bf16,x=bf16 M4096-N1024", "w=bf16,x=bf16 M4096-N8192"
    cells = {k: _cells()[k] for k in (a, b)}
    p = [{"threads": n, "vec": 4} for n in (128, 256, 512, 1024)]
    one = {"dispatch": {a: {"template": "cta_row", "params": p[0], "median_us": 9.0},
                        b: {"template": "cta_row", "params": p[1], "median_us": 50.0},
                        "w=fp32,x=fp32 M4096-N1024": {"template": "cta_row", "params": p[3], "median_us": 1.0}}}
    two = {"dispatch": {a: {"template": "rows_bulk", "params": {}, "median_us": 1.0},
                        b: {"template": "cta_row", "params": p[2], "median_us": 40.0}}}
    three = {"dispatch": {a: {"template": "cta_row", "params": p[3]}}}
    paths = []
    for name, doc in (("one", one), ("two", two), ("three", three)):
        (tmp_path / name).write_text(json.dumps(doc))
        paths.append(str(tmp_path / name))
    got = table_seeds(paths, "rmsnorm", run, cells)
    threads = {s.source[1]["N"]: s.genome.params_dict()["threads"] for s in got.seeds}
    assert threads == {1024: 128, 8192: 512}
    assert got.skipped == {"for cells not in this run": 1, "of templates not in this run": 1}
    assert all(s.genome.params_dict() == t["cta_row"].default_params() | {"threads": s.genome.params_dict()["threads"],
                                                                          "vec": 4} for s in got.seeds)


def test_every_cells_measured_best_comes_before_any_prediction(tmp_path):
    """Seeds are ordered: each cell's measured best, then the predictions round by round over the cells (a
    cell's first prediction before any cell's second). Before, cell by cell: a cell with many predictions
    pushed the later cells' measured bests out of a 16-genome first generation (kda_prefill_h100_3)."""
    t = load_templates("rmsnorm")
    run = {"cta_row": t["cta_row"]}
    a, b = "w=bf16,x=bf16 M4096-N1024", "w=bf16,x=bf16 M4096-N8192"
    cells = {k: _cells()[k] for k in (a, b)}
    p = [{"threads": n, "vec": v} for n in (128, 256, 512, 1024) for v in (2, 4)]
    measured = {"dispatch": {a: {"template": "cta_row", "params": p[0], "median_us": 9.0},
                             b: {"template": "cta_row", "params": p[1], "median_us": 50.0}}}
    guesses = {"kind": "predictions", "dispatch": {}}
    paths = []
    for i, doc in enumerate([guesses | {"dispatch": {a: {"template": "cta_row", "params": p[2]},
                                                     b: {"template": "cta_row", "params": p[5]}}},
                             guesses | {"dispatch": {a: {"template": "cta_row", "params": p[3]}}},
                             guesses | {"dispatch": {a: {"template": "cta_row", "params": p[4]},
                                                     b: {"template": "cta_row", "params": p[6]}}},
                             measured]):
        (tmp_path / f"{i}.json").write_text(json.dumps(doc))
        paths.append(str(tmp_path / f"{i}.json"))
    got = table_seeds(paths, "rmsnorm", run, cells)
    order = [(s.source[1]["N"], s.genome.params_dict()["threads"], s.genome.params_dict()["vec"]) for s in got.seeds]
    assert order == [(1024, 128, 2), (8192, 128, 4),  # the measured bests, whichever table held them
                     (1024, 256, 2), (8192, 512, 4),  # each cell's first prediction
                     (1024, 256, 4), (8192, 1024, 2),  # then each cell's second
                     (1024, 512, 2)]  # a's third


def test_the_kda_prefill_configs_first_generation_holds_every_cells_measured_best():
    """The committed prefill config's tables (measured and predicted): all of each cell's fastest measured
    entries are within the first population (a winner left out of it may never be timed by a short GA)."""
    from evo.core.config import load_config
    from evo.loop.pipeline import Session

    cfg = load_config(ROOT / "experiments/kda_prefill_h200.toml")
    measured = [p for p in cfg.search.seed_tables if json.loads(Path(p).read_text()).get("kind") != "predictions"]
    assert len(measured) < len(cfg.search.seed_tables)  # the config has predictions tables too
    with Store.open(":memory:") as s:
        session = Session(cfg, s, "check")
        cells = {c.label(): c for c in session.cells}
        every = table_seeds(cfg.search.seed_tables, session.op.name, session.templates, cells)
        bests = table_seeds(measured, session.op.name, session.templates, cells)
    assert len(every.seeds) > cfg.search.population  # more seeds than a generation holds
    assert 1 <= len(bests.seeds) <= len(cells)
    first = [x.genome.key() for x in every.seeds[:cfg.search.population]]
    assert [x.genome.key() for x in bests.seeds] == first[:len(bests.seeds)]


@pytest.mark.parametrize("text, words", [
    (None, "no such file"), ("{not json", "not JSON"), ('{"runs": {}}', "no 'dispatch' object"),
    ('{"dispatch": {"c": {"params": {}}}}', "entry 'c' has no template and params"),
])
def test_a_bad_table_is_a_config_error_naming_it(tmp_path, text, words):
    p = tmp_path / "t.json"
    if text is not None:
        p.write_text(text)
    with pytest.raises(ConfigError, match=words) as e:
        table_seeds([str(p)], "rmsnorm", load_templates("rmsnorm"), _cells())
    assert str(p) in str(e.value)


def test_relative_table_paths_are_taken_from_the_config_folder(tmp_path):
    text = SMALL.replace("{gens}", "2").replace("[search]\n", '[search]\nseed_tables = ["tables/d.json", "/abs/e.json"]\n')
    cfg = parse_config(text, path=tmp_path / "exp.toml")
    assert cfg.search.seed_tables == (str(tmp_path / "tables/d.json"), "/abs/e.json")


def test_a_seeded_run_evaluates_the_table_genomes_first(tmp_path, capsys):
    """A replay run (warm start off) with a table of two cta_row points: both are in generation 0, recorded
    with origin 'table', and the run's log says how many the tables gave."""
    t = load_templates("rmsnorm")["cta_row"]
    points = [{"threads": 256, "vec": 8, "min_blocks": 2, "weight_early": False, "load_hint": "cg", "store_hint": "cs"},
              {"threads": 1024, "vec": 4, "min_blocks": 1, "weight_early": True, "load_hint": "nc", "store_hint": "wb"}]
    table = {"run_id": "earlier", "dispatch": {
        "w=bf16,x=bf16 M4096-N1024": {"template": "cta_row", "params": points[0]},
        "w=bf16,x=bf16 M4096-N8192": {"template": "cta_row", "params": points[1]},
        "w=bf16,x=bf16 M4096-N2048": {"template": "cta_row", "params": {}}}}
    (tmp_path / "d.json").write_text(json.dumps(table))
    cfg = tmp_path / "seeded.toml"
    cfg.write_text(SMALL.replace("{gens}", "2").replace("[search]\n", '[search]\nseed_tables = ["d.json"]\n'))
    store = tmp_path / "s.duckdb"
    assert main(["run", str(cfg), "--store", str(store), "--run-id", "seeded"]) == 0

    keys = {Genome.make("rmsnorm", "cta_row", t.source_hash, t.default_params() | p).key() for p in points}
    with Store.open(store, read_only=True) as s:
        gen0 = s.sql("SELECT DISTINCT genome_key FROM evaluations WHERE run_id = 'seeded' AND generation = 0")
        origin = s.sql("SELECT genome_key, origin FROM candidates WHERE run_id = 'seeded' AND origin = 'table'")
    assert keys <= set(gen0.genome_key)
    assert set(origin.genome_key) == keys
    assert "seed tables: 2 genomes from 1 dispatch table(s); skipped 1 for cells not in this run" in \
        capsys.readouterr().out


def test_every_committed_config_with_seed_tables_resolves_them():
    """The H200 configs seed from committed results: each table exists and gives at least one seed."""
    from evo.core.config import load_config
    from evo.loop.pipeline import Session

    seeded = 0
    import tomllib

    for path in sorted((ROOT / "experiments").glob("*.toml")):
        if "run" not in tomllib.loads(path.read_text()):
            continue  # not an experiment (profile_h200.toml: profiler targets)
        cfg = load_config(path)
        if not cfg.search.seed_tables:
            continue
        with Store.open(":memory:") as s:
            session = Session(cfg, s, "check")
            got = table_seeds(cfg.search.seed_tables, session.op.name, session.templates,
                              {c.label(): c for c in session.cells})
        assert got.seeds, (path.name, got.skipped)
        seeded += 1
    assert seeded >= 5



def test_refining_round_a_table_seed_credits_only_the_lessons_behind_warm_seeds():
    """A cell's refine targets hold a warm seed (a lesson behind it) and a table seed (none): a neighbour
    polled there credits the lesson and nothing for the table seed (no KeyError when a seeded run starts warm)."""
    from types import SimpleNamespace

    from evo.loop.learn import Learner

    t = load_templates("rmsnorm")["cta_row"]

    g = Genome.make("rmsnorm", "cta_row", t.source_hash, t.default_params())
    me = Learner(SimpleNamespace(run_id="r"), targets={"c": ["table-key", "warm-key"]},
                 _seed_lessons={"warm-key": "lesson-1"})
    rows = me.refine_uses([g], lambda _: frozenset({"c", "other"}))
    assert [(r.genome_key, r.lesson_id, r.effect) for r in rows] == [(g.key(), "lesson-1", "refined")]


@pytest.mark.parametrize("config", ["kda_prefill_h200_best.toml", "kda_decode_h200_best.toml"])
def test_a_best_table_config_evaluates_exactly_its_tables_genomes_on_every_cell(config):
    """The export's re-measuring configs: one generation of exactly the table's distinct genomes (none skipped,
    none drawn at random beside them), with room to evaluate each on every cell of the run."""
    from evo.core.config import load_config
    from evo.loop.pipeline import Session

    cfg = load_config(ROOT / "experiments" / config)
    (path,) = cfg.search.seed_tables
    table = json.loads(Path(path).read_text())["dispatch"]
    with Store.open(":memory:") as s:
        session = Session(cfg, s, "check")
        cells = {c.label(): c for c in session.cells}
        got = table_seeds(cfg.search.seed_tables, session.op.name, session.templates, cells)
    assert not got.skipped
    assert set(table) == set(cells)  # the table covers the run's cells, and no other
    want = {Genome.make(session.op.name, e["template"], session.templates[e["template"]].source_hash,
                        session.templates[e["template"]].complete(e["params"])).key() for e in table.values()}
    assert {x.genome.key() for x in got.seeds} == want
    assert cfg.search.population == len(want)
    assert cfg.budget.generations == 1
    assert cfg.budget.max_evals >= len(want) * len(cells)
