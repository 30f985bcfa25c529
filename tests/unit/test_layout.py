"""The engine's layout: one package per stage, no flat modules, and no import cycle between any two
evo modules (imports inside functions included)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

EVO = Path(__file__).resolve().parents[2] / "evo"
STAGES = {"core", "templates", "build", "search", "measure", "loop", "llm", "cli", "export", "tools"}


def imports() -> dict[str, set[str]]:
    out = {}
    for p in EVO.rglob("*.py"):
        name = ".".join(p.relative_to(EVO.parent).with_suffix("").parts).removesuffix(".__init__")
        deps = set()
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("evo"):
                deps.add(n.module)
            elif isinstance(n, ast.Import):
                deps |= {a.name for a in n.names if a.name.startswith("evo")}
        out[name] = deps
    return out


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_every_stage_is_a_package_and_nothing_is_flat():
    assert {p.name for p in EVO.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == STAGES
    assert sorted(p.name for p in EVO.glob("*.py")) == ["__init__.py"]


def test_no_import_cycles():
    g = imports()
    cycles = sorted({(a, b) for a, ds in g.items() for b in ds if b in g and a in reach(g, b)})
    assert not cycles, cycles
    pkg = {}
    for a, ds in g.items():
        for b in ds:
            pa, pb = ".".join(a.split(".")[:2]), ".".join(b.split(".")[:2])
            if pa != pb and pb != "evo":
                pkg.setdefault(pa, set()).add(pb)
    stage_cycles = sorted({(a, b) for a, ds in pkg.items() for b in ds if a in reach(pkg, b)})
    assert not stage_cycles, stage_cycles


def test_the_build_stage_reaches_no_llm_module():
    """Compiling needs the templates' safety checks, not the LLM operator: no import path from evo.build (the
    compile processes' code) into evo.llm."""
    g = imports()
    reached = set().union(*(reach(g, m) for m in g if m.startswith("evo.build")))
    assert not {m for m in reached if m.startswith("evo.llm")}, sorted(reached)


# The start of a SQL statement or of a piece of one (upper case, as the store's queries write it).
_SQL = re.compile(r"^\s*(WITH|SELECT|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|CREATE\s+TABLE|ALTER\s+TABLE|"
                  r"FROM|WHERE|AND|JOIN|LEFT\s+JOIN|GROUP\s+BY|ORDER\s+BY)\b")


def _imports_duckdb(n: ast.AST) -> bool:
    if isinstance(n, ast.Import):
        return any(a.name.split(".")[0] == "duckdb" for a in n.names)
    return isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "duckdb"


def sql_under(root: Path) -> list[str]:
    """Every place under root that runs a query itself, imports DuckDB, or holds SQL text."""
    found = []
    for p in sorted(root.rglob("*.py")):
        where = p.relative_to(root.parent)
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in (
                    "sql", "execute", "executemany"):
                found.append(f"{where}:{n.lineno}: .{n.func.attr}(")
            elif _imports_duckdb(n):
                found.append(f"{where}:{n.lineno}: imports duckdb")
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and _SQL.match(n.value):
                found.append(f"{where}:{n.lineno}: {n.value.strip()[:60]!r}")
    return found


def test_sql_lives_in_the_store_package():
    """The stages ask memory/ by name (memory.runs, memory.results, ...); no SQL is written or run under evo/."""
    assert sql_under(EVO) == []


def test_the_sql_check_finds_queries(tmp_path):
    (tmp_path / "evo").mkdir()
    (tmp_path / "evo" / "x.py").write_text(
        'import duckdb\n\n\ndef f(store):\n    return store.sql("SELECT 1 AS n " "FROM runs")\n\n\n'
        'Q = "WHERE run_id = ?"\nHELP = \'e.g. kfactory sql "SELECT * FROM runs"\'\n')
    assert sorted(f.split(": ", 1)[1] for f in sql_under(tmp_path / "evo")) == [
        "'SELECT 1 AS n FROM runs'", "'WHERE run_id = ?'", ".sql(", "imports duckdb"]




def test_ops_import_nothing_from_evo_beyond_core():
    """An op folder (its spec, references, device hooks, export plug-in) depends on the engine's vocabulary
    (evo.core) only; the exporter hands its plug-in what it needs (evo/export/readme.Parts)."""
    ops_root = EVO.parent / "ops"
    upward = set()
    for p in ops_root.rglob("*.py"):
        name = ".".join(p.relative_to(ops_root.parent).with_suffix("").parts).removesuffix(".__init__")
        for n in ast.walk(ast.parse(p.read_text())):
            mods = [n.module] if isinstance(n, ast.ImportFrom) and n.module else \
                [a.name for a in n.names] if isinstance(n, ast.Import) else []
            upward |= {(name, m) for m in mods if m.startswith("evo") and not m.startswith("evo.core")}
    assert upward == set(), sorted(upward)


def test_experiments_import_the_installed_packages_without_path_edits():
    """Scripts under experiments/ reach evo, ops and memory as installed packages, never by editing sys.path."""
    root = EVO.parent / "experiments"
    found = [f"{p.relative_to(root.parent)}:{i}" for p in sorted(root.rglob("*")) if p.suffix in (".py", ".sh")
             for i, line in enumerate(p.read_text().splitlines(), 1) if "sys.path" in line]
    assert found == []


def test_experiments_reach_the_engine_through_its_public_api():
    """Scripts under experiments/ import the names `evo` exports (its public API, evo/__init__.py) and nothing else
    of the project's packages (the CLI is the other way in)."""
    import evo

    root = EVO.parent / "experiments"
    found = []
    for p in sorted(root.rglob("*.py")):
        for n in ast.walk(ast.parse(p.read_text())):
            mods = [(n.module, [a.name for a in n.names])] if isinstance(n, ast.ImportFrom) and n.module else \
                [(a.name, []) for a in n.names] if isinstance(n, ast.Import) else []
            for m, names in mods:
                if m.split(".")[0] in ("evo", "ops", "memory", "templates") and \
                        (m != "evo" or not set(names) <= set(evo.__all__)):
                    found.append(f"{p.relative_to(root.parent)}:{n.lineno}: {m} {names}")
    assert found == []


def test_tests_read_frozen_fixtures_not_the_experiments_results():
    """Tests read tests/fixtures/, never the experiments' results folder (its canonical folders change when a table
    is published again); only the published tables' own test reads those folders."""
    tests = EVO.parent / "tests"
    allowed = {Path(__file__).resolve(), tests / "unit" / "test_results_tables.py"}
    results = re.compile("experiments" + r"/results|\"experiments\"\s*/\s*\"results\"")  # split: grep finds no hit here
    found = [f"{p.relative_to(tests.parent)}:{i}" for p in sorted(tests.rglob("*.py")) if p.resolve() not in allowed
             for i, line in enumerate(p.read_text().splitlines(), 1) if results.search(line)]
    assert found == []


def test_experiments_results_holds_only_canonical_folders():
    """The experiments' results folder keeps the published tables' folders and the few files the README cites."""
    assert len(list((EVO.parent / "experiments" / "results").iterdir())) <= 20


def test_the_public_api_example_runs_and_every_name_loads():
    """evo's docstring example (a build by NVRTC through the public names) runs as written; every exported name
    loads; a name it does not export is an AttributeError that lists the public ones."""
    import contextlib
    import io
    import textwrap

    import evo

    doc = evo.__doc__
    example = textwrap.dedent(doc[doc.index("    from evo import"):].split('"""')[0])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(example, "evo's example", "exec"), {})
    assert out.getvalue().startswith("Status.OK {'rmsnorm_cta_row': KernelResources(")
    assert all(getattr(evo, n) is not None for n in evo.__all__)
    with pytest.raises(AttributeError, match="its public names: BuildInput"):
        evo.internals  # noqa: B018
