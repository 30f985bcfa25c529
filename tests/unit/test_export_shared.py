"""What the export's op families share instead of each writing it again: the `Choice` record and the
GPU's arch (runtime/package/choice.py), the nearest-genome ranking and the refusal (ladder.py), the
torch API imported on first use (lazy.py), the benchmark's command line and report (benchmark.py), and
the README sections (evo/export/readme.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from evo.export import readme
from evo.export.runtime.package import benchmark, choice, ladder, lazy
from evo.export.runtime.package.ladder import Step

DIMS = (("M", 4096), ("N", 1024))
DTYPES = (("w", "bfloat16"), ("x", "bfloat16"))


@dataclass(frozen=True)
class EntryChoice(choice.Choice):
    """A family's Choice with a field of its own, as KDA's (its entry point)."""

    entry: str = "first"

    def head(self) -> str:
        return f"{self.entry} {dict(self.dims)['N']}"


def test_a_choice_says_its_path_kernel_and_notes_in_one_line():
    c = choice.Choice("rmsnorm", "rerender", DIMS, DTYPES, 90, "the genome of c1", "cta_row-abc",
                      (("threads", 128), ("vec", 8)), notes=("compiled for sm_90",))
    assert str(c) == ("rmsnorm w=bf16,x=bf16 M=4096 N=1024 sm_90: rerender: cta_row-abc(threads=128, vec=8): "
                      "the genome of c1; compiled for sm_90")
    assert c.kernel and not c.checked_by_factory
    t = choice.Choice("rmsnorm", "torch", DIMS, DTYPES, 90, "bias")
    assert str(t) == "rmsnorm w=bf16,x=bf16 M=4096 N=1024 sm_90: torch: torch fp32: bias" and not t.kernel
    missing = choice.Choice("kda", "missing", DIMS, DTYPES, 90, "no prefill kernel")
    assert not missing.kernel and ": missing: no kernel: " in str(missing)


@pytest.mark.parametrize("path,kernel,checked", [("table", True, True), ("table-build", True, True),
                                                 ("rerender", True, False), ("repaired", True, False),
                                                 ("torch", False, False)])
def test_which_paths_launch_a_kernel_and_which_the_factory_checked(path, kernel, checked):
    c = choice.Choice("op", path, DIMS, DTYPES, 90, "why")
    assert (c.kernel, c.checked_by_factory) == (kernel, checked)


def test_notes_and_steps_keep_a_family_s_own_fields():
    step = Step("table-build", "prebuilt b1", "cta_row-abc", (("vec", 8),), (("N", 1024),), "b1", "c1", ("n1",))
    c = EntryChoice.of_step("kda", step, DIMS, DTYPES, 90, entry="second")
    assert type(c) is EntryChoice and c.entry == "second" and c.build == "b1" and c.consts == (("N", 1024),)
    assert (c.path, c.reason, c.template, c.params, c.source_cell, c.notes) == (
        "table-build", "prebuilt b1", "cta_row-abc", (("vec", 8),), "c1", ("n1",))
    assert c.with_notes([]) is c
    more = c.with_notes(["n2"])
    assert type(more) is EntryChoice and more.entry == "second" and more.notes == ("n1", "n2")
    assert str(more).startswith("second 1024 sm_90: table-build: cta_row-abc(vec=8): prebuilt b1; n1; n2")
    assert more != c


def test_the_device_arch_is_none_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert choice.device_arch() is None


def _entry(cell, template, params, dims, dtypes=DTYPES):
    return SimpleNamespace(cell=cell, template=template, params=params, dims=tuple(sorted(dims.items())),
                           dtypes=dtypes)


def test_genomes_rank_same_dtypes_then_the_family_s_key_then_nearest_dims():
    want = {"M": 4096, "N": 1024}
    fp32 = (("w", "float32"), ("x", "float32"))
    entries = [_entry("far", "t", (("v", 1),), {"M": 4096, "N": 65536}),
               _entry("fp32-exact", "t", (("v", 2),), want, fp32),
               _entry("near", "t", (("v", 3),), {"M": 4096, "N": 2048}),
               _entry("near-same-genome", "t", (("v", 3),), {"M": 4096, "N": 1024})]
    ranked = ladder.nearest_first(entries, want, dict(DTYPES))
    assert [e.cell for e in ranked] == ["near-same-genome", "far", "fp32-exact"]  # one genome once, at its nearest
    odd = ladder.nearest_first(entries, want, dict(DTYPES), lambda e: e.cell.startswith("near"))
    assert [e.cell for e in odd] == ["far", "near-same-genome", "fp32-exact"]


def test_the_refusal_names_the_nearest_genome_and_what_it_breaks():
    template = SimpleNamespace(violations=lambda params, arch, dtypes, dims: ["n_divisible", "smem_fits"])
    table = SimpleNamespace(templates={"t": template})
    nearest = _entry("c7", "t", (("v", 8),), {"M": 1, "N": 3})
    assert ladder.refusal(table, nearest, 90, {"M": 1, "N": 3}, dict(DTYPES)) == (
        "no exported template admits it (nearest genome, of c7, breaks n_divisible, smem_fits)")
    assert ladder.refusal(table, nearest, 90, {"M": 1, "N": 3}, dict(DTYPES), "prefill").startswith(
        "no exported prefill template admits it (nearest genome, of c7")


def test_the_torch_api_is_imported_on_first_use_only(tmp_path, monkeypatch):
    pkg = tmp_path / "lazy_pkg_for_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "api.py").write_text("IMPORTED = True\ndef go():\n    return 'went'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    getattr_ = lazy.on_first_use("lazy_pkg_for_test", "api", ("go",))
    try:
        assert "lazy_pkg_for_test.api" not in sys.modules
        with pytest.raises(AttributeError, match="module 'lazy_pkg_for_test' has no attribute 'IMPORTED'"):
            getattr_("IMPORTED")
        assert "lazy_pkg_for_test.api" not in sys.modules
        assert getattr_("go")() == "went" and "lazy_pkg_for_test.api" in sys.modules
        assert vars(sys.modules["lazy_pkg_for_test"])["go"] is sys.modules["lazy_pkg_for_test.api"].go  # kept
    finally:
        for name in ("lazy_pkg_for_test.api", "lazy_pkg_for_test"):
            sys.modules.pop(name, None)


def test_geomean():
    assert benchmark.geomean([]) is None
    assert benchmark.geomean(iter([2.0, 8.0])) == pytest.approx(4.0)


def _fake_torch(cuda: bool) -> SimpleNamespace:
    return SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: cuda, get_device_name=lambda: "Fake GPU"),
                           __version__="9.9", version=SimpleNamespace(cuda="13.0"))


def test_the_benchmark_without_a_gpu_says_so_and_exits_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(False))
    called = []
    assert benchmark.main(["--out", str(tmp_path / "b.json")], "d", "q", lambda a: called.append(a)) == 2
    assert "no CUDA GPU visible" in capsys.readouterr().err and not called and not (tmp_path / "b.json").exists()


def test_the_benchmark_command_line_defaults():
    args = benchmark.parser("d", "q").parse_args([])
    assert args.samples == 100 and not args.quick and args.out.name.endswith("_bench.json")


def _run():
    genome = SimpleNamespace(short=lambda: "cta_row(vec=8)")
    entries = [SimpleNamespace(cell="c1", genome=genome, median_us=4.0, baseline="torch", baseline_us=6.0, speedup=1.5),
               SimpleNamespace(cell="c2", genome=genome, median_us=None, baseline="", baseline_us=None, speedup=None)]
    return SimpleNamespace(op="rmsnorm", entries=entries)


def test_readme_sections():
    assert readme.cells_table(_run()) == [
        "| cell | kernel | median us | baseline | baseline us | speedup |", "| --- | --- | --- | --- | --- | --- |",
        "| c1 | `cta_row(vec=8)` | 4.00 | torch | 6.00 | 1.500 |", "| c2 | `cta_row(vec=8)` | - | - | - | - |"]
    prov = {"ops": {"rmsnorm": {"geomean_speedup_vs_baseline": 1.23456, "table_from": "the run", "sources": ["gpu"],
                                "fingerprint_classes": []}}}
    assert readme.measured(_run(), prov) == (
        "2 cells, table from the run, measured by gpu (fingerprint classes -); geomean speedup over the baseline "
        "timed beside each kernel 1.235.")
    inst = readme.install("other GPUs")
    assert inst[0] == "## Install" and "plus NVRTC and CUDA headers: other GPUs" in inst[4] and inst[-1] == ""
    tb = readme.tests_and_bench("kf_x", "torch eager")
    assert tb[0] == "## Tests and benchmark" and tb[4] == (
        "python -m kf_x.bench --out bench.json   # the package vs every installed peer, one process")
    assert "against torch eager on every cell" in " ".join(tb)
