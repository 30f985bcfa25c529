"""Failures a run used to keep silent: its build errors (summed up at its end; nothing built OK is exit 2), a header
expression reading an unknown name, two files declaring one template, and a broken file that only the runs using
it stop on."""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path

import pytest

from evo.cli.main import main
from evo.core.config import parse_config
from evo.loop.pipeline import Session
from evo.templates.sandbox import TEMPLATES_ROOT
from evo.templates.template import TemplateError, load_templates
from memory import Store
from evo.core.registry import KNOWN
from tests.unit.test_render_build import HEADER
from tests.unit.test_search_replay import SMALL

OK_BODY = 'extern "C" __global__ void k(float* x) { x[0] = 1.f; }\n'
JINJA_ERROR = '{{ no_such_name }}\nextern "C" __global__ void k(float* x) { x[0] = 1.f; }\n'
CUDA_ERROR = 'extern "C" __global__ void k(float* x) { x[0] = undeclared_symbol; }\n'


def _template(root: Path, file: str, body: str, name: str = "", header: str = HEADER, op: str = "rmsnorm") -> Path:
    """A template file under root/op: HEADER (test_render_build's) named `name` (default: the file's stem)."""
    path = root / op / f"{file}.cu.j2"
    path.parent.mkdir(parents=True, exist_ok=True)
    head = header.replace('name = "evil"', f'name = "{name or file}"').replace('op = "rmsnorm"', f'op = "{op}"')
    path.write_text(head + body)
    return path


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A templates folder runs load from (kfactory run reads templates/ otherwise)."""
    r = tmp_path / "templates"
    (r / "rmsnorm").mkdir(parents=True)
    monkeypatch.setattr("evo.loop.pipeline.load_templates", partial(load_templates, root=r))
    return r


def _small(templates: list[str], runner: str = "none") -> str:
    """test_search_replay's SMALL over other templates (its search.space sections dropped) and runner."""
    text = SMALL.replace('templates = ["warp_row", "cta_row"]', f"templates = {json.dumps(templates)}")
    text = text[:text.index("[search.space.warp_row]")] + text[text.index("[lessons]"):]
    return text.replace('runner = "replay"', f'runner = "{runner}"').replace("{gens}", "2")


def _run(tmp_path: Path, text: str) -> tuple[int, Path]:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    store = tmp_path / "s.duckdb"
    return main(["run", str(cfg), "--store", str(store), "--run-id", "r"]), store


def _err_line(capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """(stdout, the one line on stderr)."""
    out, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err  # one line, no traceback
    return out, lines[0]


# ---------------------------------------------------------------- 1: the build summary, and nothing OK is an error


@pytest.mark.parametrize("body, status, says", [
    (JINJA_ERROR, "RENDER_ERROR", "'no_such_name' is undefined"),
    (CUDA_ERROR, "COMPILE_ERROR", "undeclared_symbol"),
], ids=["jinja", "cuda"])
def test_a_run_where_nothing_builds_says_why_and_exits_2(root: Path, tmp_path: Path, capsys, body: str, status: str,
                                                         says: str) -> None:
    _template(root, "bad", body)
    code, store = _run(tmp_path, _small(["bad"]))
    out, line = _err_line(capsys)
    assert code == 2
    assert line.startswith("kfactory run: error: none of the run's 1 distinct builds came out OK")
    assert f"{status} in template bad" in line and says in line
    assert f"builds: 1 distinct: 1 {status} (1 compiled in this run, 0 reused from the store)\n" \
           f"  template bad: 1 {status}\n" in out
    (quoted,) = [x for x in out.splitlines() if x.startswith(f"    {status}: ")]
    with Store.open(store, read_only=True) as s:  # everything is recorded: the build, its candidate, the run
        b = s.sql("SELECT status, error FROM builds WHERE run_id = 'r'")
        run = s.sql("SELECT status, message FROM runs WHERE run_id = 'r'").iloc[0]
        assert len(s.sql("SELECT * FROM candidates WHERE run_id = 'r'")) == 1
    assert b.status.tolist() == [status] and says in b.error[0]
    assert quoted == f"    {status}: {b.error[0]}"  # the message verbatim
    assert run.status == "failed" and "NothingBuiltError" in run.message and says in run.message


def test_a_run_with_some_builds_ok_sums_them_up_and_exits_0(root: Path, tmp_path: Path, capsys) -> None:
    _template(root, "good", OK_BODY)
    _template(root, "bad", JINJA_ERROR)
    code, store = _run(tmp_path, _small(["good", "bad"]))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.splitlines()[-4:] == ["builds: 2 distinct: 1 OK, 1 RENDER_ERROR (2 compiled in this run, 0 reused "
                                     "from the store)",  # then per template, failing ones first
                                     "  template bad: 1 RENDER_ERROR",
                                     "    RENDER_ERROR: UndefinedError: 'no_such_name' is undefined",
                                     "  template good: 1 OK"]
    with Store.open(store, read_only=True) as s:
        assert s.sql("SELECT status FROM runs WHERE run_id = 'r'").status[0] == "done"


def test_the_search_loop_ends_with_the_summary_and_exits_2_when_nothing_built(root: Path, tmp_path: Path,
                                                                                capsys) -> None:
    _template(root, "bad", JINJA_ERROR)
    code, store = _run(tmp_path, _small(["bad"], runner="replay"))
    out, line = _err_line(capsys)
    assert code == 2 and "none of the run's 1 distinct builds came out OK (1 RENDER_ERROR)" in line
    assert out.splitlines()[-3:] == ["builds: 1 distinct: 1 RENDER_ERROR", "  template bad: 1 RENDER_ERROR",
                                     "    RENDER_ERROR: UndefinedError: 'no_such_name' is undefined"]
    with Store.open(store, read_only=True) as s:
        assert s.sql("SELECT status FROM runs WHERE run_id = 'r'").status[0] == "failed"
        assert set(s.sql("SELECT status FROM evaluations WHERE run_id = 'r'").status) == {"RENDER_ERROR"}
        assert (Path(store).parent / "runs" / "r" / "dispatch.json").exists()  # the end still wrote its table


def test_a_resume_with_nothing_left_to_build_counts_the_builds_it_made_before(root: Path, tmp_path: Path,
                                                                             capsys) -> None:
    _template(root, "good", OK_BODY)  # builds OK; the replay data never measured it (UNKNOWN)
    code, store = _run(tmp_path, _small(["good"], runner="replay"))
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["resume", "r", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert "resumed r" in out and out.splitlines()[-2:] == ["builds: 1 distinct: 1 OK", "  template good: 1 OK"]


# ---------------------------------------------------------------- 2: a header expression reading an unknown name


@pytest.mark.parametrize("old, new, where, name", [
    ("[[launch]]", '[constraints]\nfits = "threads * x_bytez <= 4096"\n[[launch]]', "[constraints].fits", "x_bytez"),
    ('grid = ["M"]', 'grid = ["ceil_div(MM, 4)"]', "[[launch]] #0.grid", "MM"),
    ('args = ["x"]', 'args = ["x"]\nwhen = "use_it"', "[[launch]] #0.when", "use_it"),
    ('args = ["x"]', 'args = ["x"]\n[workspace]\nscratch = "threads * nope"', "[workspace].scratch", "nope"),
], ids=["constraint", "grid", "when", "workspace"])
def test_a_header_expression_reading_an_unknown_name_names_the_file_and_the_name(root: Path, old: str, new: str,
                                                                                 where: str, name: str) -> None:
    path = _template(root, "typo", OK_BODY, header=HEADER.replace(old, new, 1))
    with pytest.raises(TemplateError) as e:
        load_templates("rmsnorm", root)
    assert str(e.value).startswith(f"{path}: {where} = ") and f"reads {name!r}: not a param" in str(e.value)


def test_every_name_a_context_has_is_known(root: Path) -> None:
    reads = "threads * x_bytes * w_bytes <= 4096 and arch >= 80 and N > 0 and bias == 0 and store_rstd == 0 " \
            "and ceil_div(M, threads) >= 0 and min(threads, 8) > 0 and residual_dtype != '' and out_t != ''"
    _template(root, "reads", OK_BODY, header=HEADER.replace("[[launch]]", f'[constraints]\nall = "{reads}"\n[[launch]]',
                                                            1))
    switches = "v_first + gate + qk_l2norm + beta_act >= 0 and state_bytes * K * V * HV > 0 and g_t != ''"
    kda = HEADER.replace("[[launch]]", f'[constraints]\nvariant = "{switches}"\n[[launch]]').replace('["M"]', '["T"]')
    _template(root, "switches", OK_BODY, header=kda, op="kda")
    assert list(load_templates("rmsnorm", root)) == ["reads"]
    assert list(load_templates("kda", root)) == ["switches"]  # a variant's switch dims are the op's dims


def test_every_template_in_the_repository_loads() -> None:
    ops = [op for op in KNOWN if (TEMPLATES_ROOT / op).is_dir()]
    assert len(ops) >= 4
    for op in ops:
        assert load_templates(op), op


# ---------------------------------------------------------------- 3: one template name, two files


def test_two_files_declaring_one_template_name_both_files(root: Path) -> None:
    a = _template(root, "first", OK_BODY, name="same")
    b = _template(root, "second", OK_BODY, name="same")
    _template(root, "other", OK_BODY)
    with pytest.raises(TemplateError, match="both declare template 'same'") as e:
        load_templates("rmsnorm", root)
    assert f"{a} and {b}" in str(e.value)
    warned: list[str] = []
    assert list(load_templates("rmsnorm", root, use=["other"], warn=warned.append)) == ["other"]  # neither shadows
    assert len(warned) == 1 and f"{a} and {b}" in warned[0]
    with pytest.raises(TemplateError, match="both declare template 'same'"):
        load_templates("rmsnorm", root, use=["same"], warn=warned.append)


# ---------------------------------------------------------------- 4: a broken file stops only the runs that use it


BAD_TOML = HEADER.replace("[space]\nthreads = [128]", "[space]\nthreads = [", 1)
BROKEN = {  # kind: (header, what the warning says)
    "toml": (BAD_TOML, "header is not valid TOML"),
    "unknown-name": (HEADER.replace('grid = ["M"]', 'grid = ["MM"]', 1), "reads 'MM'"),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_template_warns_a_run_that_names_others_and_it_goes_on(root: Path, tmp_path: Path, capsys,
                                                                        kind: str) -> None:
    header, says = BROKEN[kind]
    path = _template(root, "broken", OK_BODY, header=header)
    _template(root, "good", OK_BODY)
    code, _ = _run(tmp_path, _small(["good"]))
    out, err = capsys.readouterr()
    assert code == 0, err
    warnings = [x for x in out.splitlines() if x.startswith("warning:")]
    assert len(warnings) == 1 and str(path) in warnings[0] and says in warnings[0]
    assert "builds: 1 distinct: 1 OK" in out


@pytest.mark.parametrize("templates", [["good", "broken"], []], ids=["named", "all"])
def test_a_broken_template_fails_a_run_that_uses_it_in_one_line(root: Path, tmp_path: Path, capsys,
                                                                 templates: list[str]) -> None:
    path = _template(root, "broken", OK_BODY, header=BAD_TOML)
    _template(root, "good", OK_BODY)
    text = _small(templates) if templates else _small(["x"]).replace('templates = ["x"]', "")
    code, store = _run(tmp_path, text)
    out, line = _err_line(capsys)
    assert code == 2 and line.startswith(f"kfactory run: error: {path}: header is not valid TOML")
    assert not store.exists()  # refused before the run was recorded


def test_a_session_skips_a_broken_template_it_does_not_use(root: Path, tmp_path: Path) -> None:
    for name in ("warp_row", "cta_row"):
        shutil.copy(TEMPLATES_ROOT / "rmsnorm" / f"{name}.cu.j2", root / "rmsnorm")
    header = HEADER.replace("[[launch]]", '[constraints]\nc = "vec > 1"\n[[launch]]')
    path = _template(root, "zz", OK_BODY, header=header)
    lines: list[str] = []
    with Store.open(tmp_path / "s.duckdb") as store:
        session = Session(parse_config(SMALL.replace("{gens}", "2")), store, "s", log=lines.append)
    assert sorted(session.templates) == ["cta_row", "warp_row"]
    assert lines == [f"warning: skipped a broken template: {path}: [constraints].c = 'vec > 1' reads 'vec': not a "
                     f"param of template zz, arch, a dtype name (<role>_bytes, _dtype, _t of roles out, residual, w, "
                     f"x), a dim of op rmsnorm (M, N, bias, store_rstd) nor a sandbox global"]
