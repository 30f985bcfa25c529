"""The package on any machine (no GPU; torch only for the API tests): its data is whole and consistent,
its renderer gives back the shipped sources, explain() names a path for every searched cell, off-table
calls and variants the kernels refuse, chunk_kda says what is missing, and the torch path on CPU
tensors matches an independent float64 recurrence."""

from __future__ import annotations

import hashlib
import json

import kf_pkg as kf
import numpy as np
import pytest
from kf_pkg.choose import (
    ENTRY_POINTS,
    call_dims,
    choose,
    kind_of,
    templates_of,
    variant_dims,
)
from kf_pkg.expr import DATA

TABLES = kf.tables()
TABLE = TABLES["kda"]
ARCH = TABLE.arch_number
ENTRIES = list(TABLE.entries)
DECODE = [e for e in ENTRIES if kind_of(TABLE.templates[e.template].name) == "decode"]
HAS_PREFILL = bool(templates_of(TABLE, "chunk_kda"))


def _entry_point(e) -> str:
    kind = kind_of(TABLE.templates[e.template].name)
    return next(ep for ep, (k, _) in ENTRY_POINTS.items() if k == kind)


def test_files_are_there_and_match_their_hashes():
    doc = json.loads((DATA / "dispatch.json").read_text())
    assert set(doc["ops"]) == {"kda"} and doc["ops"]["kda"]["entries"]
    for b in doc["ops"]["kda"]["builds"].values():
        assert hashlib.sha256((DATA / b["cu"]).read_bytes()).hexdigest() == b["cu_sha256"]
        assert hashlib.sha256((DATA / b["cubin"]).read_bytes()).hexdigest() == b["cubin_sha256"]
    for tid, tm in doc["ops"]["kda"]["templates"].items():
        assert hashlib.sha256((DATA / tm["file"]).read_bytes()).hexdigest() == tm["source_hash"], tid
        assert kind_of(tm["name"]), f"template {tm['name']} serves no entry point"


@pytest.mark.parametrize("build", list(TABLE.builds.values()), ids=lambda b: b.id)
def test_renderer_gives_back_the_shipped_source(build):
    t = TABLE.templates[build.template]
    src = t.render(dict(build.params), ARCH, dict(build.dtypes), dict(build.consts))
    assert src == (DATA / build.cu).read_text()


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.cell)
def test_every_searched_cell_takes_its_table_kernel(entry):
    c = choose(_entry_point(entry), entry.dims, entry.dtypes, ARCH)
    assert (c.path, c.build, c.template, c.params) == ("table", entry.build, entry.template, entry.params), str(c)
    launches, _ = TABLE.templates[c.template].plan(dict(c.params), ARCH, dict(c.dtypes), dict(c.dims))
    d = dict(c.dims)
    assert launches
    for ln in launches:
        # per value head and sequence (recurrent), or per value head and batch row (chunk: B = 1 when varlen);
        # or a persistent grid whose kernel walks N x HV x tiles itself (recurrent_bulk)
        per_head = ln.grid[1] == d["HV"] and ln.grid[2] in (d["N"], d["B"])
        persistent = ln.grid[1:] == (1, 1) and {"HV", "N"} <= set(ln.args)
        assert per_head or persistent, ln
    assert all(32 <= ln.block[0] <= 1024 for ln in launches)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.cell)
def test_every_searched_cell_has_a_probe_shape_its_template_admits(entry):
    """The first-use check's shape for the cell's class: T (a decode batch's B too) by its class, at most two
    sequences of an equal-length prefill batch or three of a varlen one, the rest as the cell's; legal for the
    template, so a table kernel is probed rather than checked on a caller's whole call."""
    from kf_pkg.choose import PROBE_SEQS, probe_dims
    from kf_pkg.firstuse import PROBE_TILE

    c = choose(_entry_point(entry), entry.dims, entry.dtypes, ARCH)
    d, p = dict(c.dims), dict(probe_dims(c))
    assert set(p) == set(d) and all(p[k] == d[k] for k in d if k not in ("B", "T", "N", "Ncu"))
    assert p["T"] == d["T"] if d["T"] <= PROBE_TILE else (PROBE_TILE <= p["T"] < 2 * PROBE_TILE
                                                         and p["T"] % PROBE_TILE == d["T"] % PROBE_TILE)
    assert p["Ncu"] == p["N"] + 1 and p["N"] <= (PROBE_SEQS if d["N"] != d["B"] else max(2, min(d["B"], 127)))
    assert TABLE.templates[c.template].violations(dict(c.params), ARCH, dict(c.dtypes), p) == []


@pytest.mark.parametrize("kernel", ["right", "wrong"])
def test_a_table_kernel_is_probed_on_first_use_and_dropped_when_wrong(kernel):
    """A table kernel's first call in a class runs the probe first (fresh inputs at the class's shape, checked
    against float64): a right kernel then serves the call and the next without another probe; a wrong one is
    dropped with one warning and never launched on the caller's data."""
    torch = pytest.importorskip("torch")
    from kf_pkg import reference, run
    from kf_pkg.choose import VARIANT_DIMS

    e = next(x for x in ENTRIES if dict(x.dims)["N"] == dict(x.dims)["B"])
    entry = _entry_point(e)
    d = dict(e.dims) | {"B": 2, "N": 2, "Ncu": 3, "T": 3 if dict(e.dims)["T"] > 1 else 1}
    c = kf.Choice("kda", "table", tuple(sorted(d.items())), e.dtypes, ARCH, "test", e.template, e.params,
                  entry=entry)
    variant = {v: d[v] for v in VARIANT_DIMS}
    launched = []

    def fake_launch(choice, tensors, scalars):  # stands in for the GPU: writes what the kernel would
        launched.append(dict(choice.dims)["T"])
        o, s = reference.kda(*(tensors[n] for n in ("q", "k", "v", "g", "beta")), A_log=tensors.get("A_log"),
                             dt_bias=tensors.get("dt_bias"), scale=scalars["scale"],
                             initial_state=tensors["initial_state"], cu_seqlens=tensors.get("cu_seqlens"),
                             gate=variant["gate"], beta_act=variant["beta_act"], qk_l2norm=bool(variant["qk_l2norm"]),
                             v_first=bool(variant["v_first"]), lower_bound=scalars["lower_bound"],
                             acc=torch.float64)
        tensors["o"].copy_(o + (0 if kernel == "right" else 1))
        tensors["final_state"].copy_(s)

    rt = run.Runtime()
    rt.launcher.run = fake_launch
    rt.choice = lambda *a: c
    xdt, gdt = getattr(torch, dict(e.dtypes)["x"]), getattr(torch, dict(e.dtypes)["g"])
    b, t, h, hv, dk, dv = (d[k] for k in ("B", "T", "H", "HV", "K", "V"))
    q = torch.nn.functional.normalize(torch.randn(b, t, h, dk), dim=-1).to(xdt)
    k = torch.nn.functional.normalize(torch.randn(b, t, h, dk), dim=-1).to(xdt)
    tensors = {"q": q, "k": k, "v": torch.randn(b, t, hv, dv).to(xdt), "beta": torch.rand(b, t, hv).to(xdt),
               "g": (torch.randn(b, t, hv, dk) if variant["gate"] else -torch.rand(b, t, hv, dk)).to(gdt)}
    if variant["gate"]:
        tensors |= {"A_log": torch.zeros(hv), "dt_bias": torch.zeros(hv * dk)}
    if kernel == "right":
        o1, _ = rt.call(entry, tensors, None, None, variant)
        o2, _ = rt.call(entry, tensors, None, None, variant)
        assert launched == [t, t, t] and torch.equal(o1, o2)
        assert rt.counts[(entry, "table")] == 2
    else:
        with pytest.warns(RuntimeWarning, match="first-use check at"):
            rt.call(entry, tensors, None, None, variant)
        rt.call(entry, tensors, None, None, variant)
        assert launched == [t] and rt.counts[(entry, "torch")] == 2


# The cell the calls below start from: the first decode cell, or in a package without one the first prefill cell
# (its entry point, chunk_kda, then takes the calls)
BASE = DECODE[0] if DECODE else ENTRIES[0]
BASE_ENTRY = _entry_point(BASE)


def _explain_near_base(**over):
    """explain() of a call of BASE_ENTRY near BASE, with `over` replacing q/v dims or keywords."""
    d = dict(BASE.dims)
    b, t, h, k, hv, v = (over.pop(n, d[m]) for n, m in (("b", "B"), ("t", "T"), ("h", "H"), ("k", "K"),
                                                         ("hv", "HV"), ("v", "V")))
    dt = dict(BASE.dtypes)
    return kf.explain((b, t, h, k), (b, t, hv, v), dt["x"], entry=BASE_ENTRY, g_dtype=dt["g"],
                      arch=over.pop("arch", ARCH), **over)


@pytest.mark.skipif(not DECODE, reason="no decode cell exported")
def test_off_table_decode_calls_get_a_kernel_path():
    d = dict(DECODE[0].dims)
    assert _explain_near_base(b=3).path == "table-build"  # B is no compiled-in dim
    assert _explain_near_base(b=3, t=3).path == "table-build"
    assert _explain_near_base(b=5, h=2, hv=4).path == "table-build"  # grouped value heads: HV / H read at run time
    assert _explain_near_base(b=1, t=7, n_seqs=3).path == "table-build"  # a varlen batch: cu_seqlens read at run time
    c = _explain_near_base(k=d["K"] // 2)
    assert c.path in ("rerender", "repaired") and dict(c.consts)["K"] == d["K"] // 2, str(c)
    other = _explain_near_base(arch=ARCH + 10)
    assert other.path in ("rerender", "repaired") and "compiled for it" in str(other)


@pytest.mark.skipif(not DECODE, reason="no decode cell exported")
@pytest.mark.parametrize("over,words", [
    ({"use_gate_in_kernel": True}, "gate_is_log_space"),
    ({"use_gate_in_kernel": True, "lower_bound": -5.0}, "gate_is_log_space"),
    ({"state_v_first": True}, "state_is_k_first"),
    ({"t": 100}, ("short_sequences", "one_token")),
], ids=["softplus-gate", "lower-bound-gate", "v-first", "long-T"])
def test_variants_the_decode_template_refuses_take_torch_and_say_which(over, words):
    """The decode templates known to refuse these variants (recurrent: T <= 64; recurrent_bulk: T = 1) send
    them to torch, naming the rule; a table with another decode template may admit them."""
    if any(TABLE.templates[t].name not in ("recurrent", "recurrent_bulk") for t in templates_of(TABLE, "fused_recurrent_kda")):
        pytest.skip("another decode template is exported: it may admit the variant")
    c = _explain_near_base(**over)
    words = (words,) if isinstance(words, str) else words
    assert c.path == "torch" and any(w in c.reason for w in words), str(c)


def test_compiled_in_variants_are_served_by_a_kernel():
    """In-kernel q, k L2 norm and beta sigmoid with negative eigenvalues: a kernel of the package's templates
    (decode, or chunk_kda's in a package without decode) compiles them in."""
    c = _explain_near_base(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    assert c.kernel and dict(c.consts).get("beta_act", 2) == 2, str(c)


def test_chunk_kda_without_a_prefill_template_says_what_is_missing():
    d = dict(ENTRIES[0].dims)
    c = kf.explain((1, 8192, d["H"], d["K"]), (1, 8192, d["HV"], d["V"]), entry="chunk_kda", arch=ARCH)
    if HAS_PREFILL:
        assert c.path != "missing", str(c)
    else:
        assert c.path == "missing" and not c.kernel and "chunk" in c.reason and "prefill" in c.reason, str(c)


def test_variant_dims_follow_fla_keywords():
    assert variant_dims() == {"gate": 0, "beta_act": 0, "qk_l2norm": 0, "v_first": 0}
    assert variant_dims(use_gate_in_kernel=True)["gate"] == 1
    assert variant_dims(use_gate_in_kernel=True, lower_bound=-5.0)["gate"] == 2
    assert variant_dims(lower_bound=-5.0)["gate"] == 0  # fla reads lower_bound only with the gate in the kernel
    assert variant_dims(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)["beta_act"] == 2
    with pytest.raises(ValueError, match="allow_neg_eigval"):
        variant_dims(allow_neg_eigval=True)
    d = call_dims((1, 7, 2, 16), (1, 7, 4, 32), 3, variant_dims(state_v_first=True))
    assert (d["N"], d["Ncu"], d["SR"], d["SC"], d["v_first"]) == (3, 4, 32, 16, 1)


def test_provenance_names_the_run():
    prov = kf.provenance()["ops"]["kda"]
    assert prov["run"]["run_id"] == TABLE.run_id and prov["cells"] == len(ENTRIES)


# ---- the torch API on CPU tensors: the torch path, against an independent float64 recurrence -------

def _naive(q, k, v, g, beta, h0, scale, l2, cu=None):
    """fla's naive recurrence in float64 numpy, K-first states, log-space g, post-activation beta."""
    b, t, h, _ = q.shape
    hv = v.shape[2]
    if l2:
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    q, k = np.repeat(q, hv // h, axis=2), np.repeat(k, hv // h, axis=2)
    seqs = [(i, 0, t) for i in range(b)] if cu is None else [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    o = np.zeros(v.shape)
    final = np.zeros(h0.shape)
    for n, (row, lo, hi) in enumerate(seqs):
        for j in range(hv):
            s = h0[n, j].copy()
            for i in range(lo, hi):
                s *= np.exp(g[row, i, j])[:, None]
                s += beta[row, i, j] * np.outer(k[row, i, j], v[row, i, j] - k[row, i, j] @ s)
                o[row, i, j] = (scale * q[row, i, j]) @ s
            final[n, j] = s
    return o, final


def _cpu_inputs(torch, b=2, t=3, h=1, hv=2, dk=8, dv=4, n=None):
    gen = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(b, t, h, dk, generator=gen, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(b, t, h, dk, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(b, t, hv, dv, generator=gen, dtype=torch.float64)
    g = -torch.exp(torch.randn(b, t, hv, dk, generator=gen, dtype=torch.float64) - 2)
    beta = torch.rand(b, t, hv, generator=gen, dtype=torch.float64)
    h0 = torch.randn(n or b, hv, dk, dv, generator=gen, dtype=torch.float64) / dk ** 0.5
    return q, k, v, g, beta, h0


def test_fused_recurrent_kda_on_cpu_is_the_torch_path_and_right():
    torch = pytest.importorskip("torch")
    q, k, v, g, beta, h0 = _cpu_inputs(torch)
    o, ht = kf.fused_recurrent_kda(q.float(), k.float(), v.float(), g.float(), beta.float(), initial_state=h0.float(),
                                   output_final_state=True)
    ref_o, ref_s = _naive(*(x.numpy() for x in (q, k, v, g, beta, h0)), scale=8 ** -0.5, l2=False)
    assert o.dtype == torch.float32 and ht.dtype == torch.float32 and ht.shape == h0.shape
    np.testing.assert_allclose(o.numpy(), ref_o, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(ht.numpy(), ref_s, atol=1e-5, rtol=1e-4)
    o2, none = kf.fused_recurrent_kda(q.float(), k.float(), v.float(), g.float(), beta.float())
    assert none is None and o2.shape == v.shape
    assert kf.stats()["fused_recurrent_kda"]["torch"] >= 2


def test_variants_on_cpu_match_the_naive_recurrence():
    torch = pytest.importorskip("torch")
    q, k, v, g, beta, h0 = _cpu_inputs(torch, b=1, t=7, n=3)
    cu = torch.tensor([0, 1, 4, 7])
    logits = torch.logit(beta)
    raw = torch.log(torch.expm1(-g))  # softplus(raw) = -g, so -exp(A_log = 0) softplus(raw) = g
    o, ht = kf.fused_recurrent_kda(3 * q, 3 * k, v, raw, logits, A_log=torch.zeros(2, dtype=torch.float64),
                                   initial_state=h0.transpose(-1, -2), output_final_state=True,
                                   use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                   use_beta_sigmoid_in_kernel=True, state_v_first=True, cu_seqlens=cu)
    ref_o, ref_s = _naive(*(x.numpy() for x in (q, k, v, g, beta, h0)), scale=8 ** -0.5, l2=True, cu=[0, 1, 4, 7])
    np.testing.assert_allclose(o.numpy(), ref_o, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(ht.transpose(-1, -2).numpy(), ref_s, atol=1e-5, rtol=1e-4)


def test_a_split_call_is_the_call_it_splits():
    """split_kda over the torch path (fused_recurrent_kda on CPU): every sequence cut into spans run as one batch,
    chained and corrected, gives the whole call's o and final state; the variants' keywords pass through."""
    torch = pytest.importorskip("torch")
    from importlib import import_module

    split = import_module(kf.__name__ + ".split")
    q, k, v, g, beta, h0 = (x.float() for x in _cpu_inputs(torch, b=2, t=12, h=1, hv=2, dk=8, dv=8))
    whole = kf.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    for spans in (1, 3, 12):
        o, ht = split.split_kda(kf.fused_recurrent_kda, q, k, v, g, beta, spans, initial_state=h0,
                                output_final_state=True)
        np.testing.assert_allclose(o.numpy(), whole[0].numpy(), atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(ht.numpy(), whole[1].numpy(), atol=1e-5, rtol=1e-4)
    kw = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, state_v_first=True)
    want = kf.fused_recurrent_kda(3 * q, 3 * k, v, g, torch.logit(beta), initial_state=h0.transpose(-1, -2),
                                  output_final_state=True, **kw)
    o, ht = split.split_kda(kf.fused_recurrent_kda, 3 * q, 3 * k, v, g, torch.logit(beta), 4,
                            initial_state=h0.transpose(-1, -2), output_final_state=True, **kw)
    np.testing.assert_allclose(o.numpy(), want[0].numpy(), atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(ht.numpy(), want[1].numpy(), atol=1e-5, rtol=1e-4)
    o, none = split.split_kda(kf.fused_recurrent_kda, q, k, v, g, beta, 2)
    assert none is None and o.shape == v.shape
    with pytest.raises(ValueError, match="T = 12 is not a multiple of spans = 5"):
        split.split_kda(kf.fused_recurrent_kda, q, k, v, g, beta, 5)
    with pytest.raises(ValueError, match="needs K == V"):
        split.split_kda(kf.fused_recurrent_kda, q, k, v[..., :4], g, beta, 2)


def test_chunk_kda_raises_missing_kernel_rather_than_computing_otherwise():
    torch = pytest.importorskip("torch")
    if HAS_PREFILL:
        pytest.skip("this export has a prefill kernel")
    q, k, v, g, beta, _ = _cpu_inputs(torch)
    with pytest.raises(kf.MissingKernel, match="chunk"):
        kf.chunk_kda(q, k, v, g, beta)


def test_keywords_the_package_does_not_implement_are_errors():
    torch = pytest.importorskip("torch")
    q, k, v, g, beta, _ = _cpu_inputs(torch)
    with pytest.raises(NotImplementedError, match="ssm_state_indices"):
        kf.fused_recurrent_kda(q, k, v, g, beta, ssm_state_indices=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="allow_neg_eigval"):
        kf.fused_recurrent_kda(q, k, v, g, beta, allow_neg_eigval=True)
    with pytest.raises(ValueError, match="g has shape"):
        kf.fused_recurrent_kda(q, k, v, g[..., :-1], beta)
