"""The engine's layout: one package per stage, no flat modules, and no import cycle between any two
evo modules (imports inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

EVO = Path(__file__).resolve().parents[2] / "evo"
STAGES = {"core", "templates", "build", "search", "measure", "loop", "llm", "cli", "export"}


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
