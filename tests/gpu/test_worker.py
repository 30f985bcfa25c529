"""On a GPU: the device fills of every input kind and the float64 device reference agree with numpy."""

import numpy as np
import pytest

from ops.rmsnorm.reference import rmsnorm_fwd
from ops.rmsnorm.spec import FILLS, cell
from evo.core.spec import DType, from_device_bytes

RAW = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


@pytest.mark.gpu
@pytest.mark.parametrize("dt, wdt, m, n", [
    ("bfloat16", "bfloat16", 37, 1000),
    ("float16", "float32", 5, 4100),
    ("float32", "float32", 3, 33),
    ("float16", "float16", 64, 8192),
], ids=lambda v: str(v))
@pytest.mark.parametrize("kind", sorted(FILLS))
def test_device_fill_and_reference_match_numpy(dt, wdt, m, n, kind):
    from evo.measure.worker import Worker

    w = Worker()
    mod, ref_obj = w._op("rmsnorm")
    c = cell(dt, m, n, wdt)
    x_buf, w_buf, ref = w.alloc(m * n * DType(dt).nbytes), w.alloc(n * DType(wdt).nbytes), w.alloc(m * n * 8)
    w.fill(x_buf, dt, m * n, n, FILLS[kind]["x"], seed=7)
    w.fill(w_buf, wdt, n, n, FILLS[kind]["w"], seed=8)
    bufs = {"x": x_buf, "w": w_buf, "ref:y": ref}
    for kernel, grid, block, args in mod.reference(c.dims_dict(), c.dtypes_dict(), {"eps": 1e-6}):
        w.launch(ref_obj, kernel, grid, block, 0, tuple(("ptr", bufs[v].ptr) if k == "buf" else (k, v) for k, v in args))
    w.sync("ref")
    x = from_device_bytes(w.to_host(x_buf.ptr, m * n * DType(dt).nbytes, RAW[dt]), DType(dt)).reshape(m, n)
    wt = from_device_bytes(w.to_host(w_buf.ptr, n * DType(wdt).nbytes, RAW[wdt]), DType(wdt))
    got = w.to_host(ref.ptr, m * n * 8, np.float64).reshape(m, n)
    expect = rmsnorm_fwd({"x": x, "w": wt}, {"eps": 1e-6})["y"]
    assert np.isfinite(x).all()
    assert np.max(np.abs(got - expect) / (np.abs(expect) + 1e-12)) < 1e-10
    spec = FILLS[kind]["x"]
    if spec.zero_rows:
        assert 0 < np.mean(np.all(x == 0, axis=1)) < 1
    if spec.constant_rows:
        assert np.all(x == x[:, :1])
    if spec.outlier:
        assert np.all(np.max(np.abs(x), axis=1) >= 0.99 * spec.outlier)
    if kind == "tiny":
        assert np.mean(x * x) < 1e-6  # below eps
    # checksums see a one-element change; the private copy matches until then
    key = 12345
    cp = w.alloc(x_buf.nbytes)
    w.copy(cp, x_buf)
    (before, hits), (copied, copy_hits) = w.audit([x_buf, cp], key)
    assert before == copied and hits == copy_hits == 0
    w.perturb(x_buf, dt, m * n, 1, 4.0, seed=3)
    assert w.audit([x_buf], key)[0][0] != before
    w.memset8(x_buf.ptr + x_buf.nbytes + 100, 0, 3)  # three bytes into the back guard zone
    assert w.audit([x_buf], key)[0][1] == 3


@pytest.mark.gpu
def test_compare_takes_a_keyed_checksum_of_the_reference_and_its_scale():
    """Gate 6's audit: every comparison given a key reports the reference's (and scale's) keyed checksum; it moves
    with one element of either, with the key, and is 0 without a key (the peer check)."""
    from evo.measure.worker import Worker

    w = Worker()
    n = 4099
    out, ref, scale = w.alloc(n * 4), w.alloc(n * 8), w.alloc(n * 8)
    w.fill(out, "float32", n, n, FILLS["normal"]["x"], seed=1)
    w.copy(ref, out)  # any bits: the checksum is over the bytes
    w.fill(scale, "float32", 2 * n, 2 * n, FILLS["normal"]["x"], seed=2)

    def sums(key, with_scale=True):
        w.compare(out, ref, "float32", n, n, 0, 1e9, 0.0, 0, scale if with_scale else None, key)
        w.compare(out, ref, "float32", n, n, 0, 1e9, 0.0, 1, scale if with_scale else None, key)
        a, b = w.collect(2)
        assert a.ref_sum == b.ref_sum  # deterministic whatever the order of the atomic adds
        return a.ref_sum

    base = sums(99)
    assert base != 0 and sums(98) != base and sums(0) == 0
    assert sums(99, with_scale=False) not in (0, base)
    def flip(ptr):  # one byte's bits inverted
        w.memset8(ptr, int(w.to_host(ptr, 1, np.uint8)[0]) ^ 0xFF, 1)

    flip(ref.ptr + 8 * 2000 + 3)  # one byte of one reference element
    moved = sums(99)
    assert moved != base
    flip(scale.ptr + 8 * (n - 1))  # one byte of the scale's last element
    assert sums(99) != moved


@pytest.mark.gpu
def test_audit_reads_exactly_a_buffers_bytes_whatever_its_guards():
    """A buffer of an odd size and its copy checksum alike though their guard patterns differ (drawn per buffer):
    the last partial word's bytes past the data are not read; one data byte still moves the checksum."""
    from evo.measure.jobs import Guard
    from evo.measure.worker import Worker

    w = Worker()
    for nbytes in (2, 198, 4099):
        a, b = w.alloc(nbytes, Guard(256, 16, 11)), w.alloc(nbytes, Guard(512, 48, 12))
        w.fill(a, "float16", nbytes // 2, nbytes // 2, FILLS["normal"]["x"], seed=3)
        w.copy(b, a)
        (ca, ha), (cb, hb) = w.audit([a, b], 77)
        assert ca == cb and ha == hb == 0
        w.memset8(b.ptr + nbytes - 1, int(w.to_host(b.ptr + nbytes - 1, 1, np.uint8)[0]) ^ 0x01, 1)
        assert w.audit([b], 77)[0][0] != ca
