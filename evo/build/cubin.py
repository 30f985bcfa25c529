"""What a cubin says about its kernels, read from its ELF without a GPU or a toolkit: each entry function's
register count, from the EIATTR_REGCOUNT records of the `.nv.info` section (attribute 0x2f: the function's symbol
index and its registers, as ptxas allocated them). The fallback for a build whose compiler handed back no ptxas
report (evo/build/nvrtc.py: compile_one); tests/unit/test_cubin.py checks it against ptxas's own report."""

from __future__ import annotations

import struct

EIATTR_REGCOUNT = 0x2F
EIFMT_SVAL = 0x04  # a record with a 16-bit payload size and the payload after it; the other formats carry 2 bytes


class CubinError(ValueError):
    """Bytes that are not a 64-bit little-endian ELF, or whose sections run past its end."""


def _sections(cubin: bytes) -> list[tuple[str, int, int]]:
    """(name, offset, size) of every section."""
    if cubin[:4] != b"\x7fELF" or len(cubin) < 64 or cubin[4] != 2 or cubin[5] != 1:
        raise CubinError("not a 64-bit little-endian ELF (a cubin)")
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    if shoff + shnum * shentsize > len(cubin) or shstrndx >= shnum:
        raise CubinError("section headers past the end of the cubin")
    heads = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = heads[shstrndx][4]
    out = []
    for h in heads:
        name_off, offset, size = h[0], h[4], h[5]
        if h[1] != 8 and offset + size > len(cubin):  # type 8 (NOBITS) holds no bytes in the file
            raise CubinError("a section runs past the end of the cubin")
        out.append((_cstr(cubin, names_at + name_off), offset, size))
    return out


def _cstr(b: bytes, at: int) -> str:
    end = b.find(b"\0", at)
    if at >= len(b) or end < 0:
        raise CubinError("a name runs past the end of the cubin")
    return b[at:end].decode("utf-8", "replace")


def cubin_regcounts(cubin: bytes) -> dict[str, int]:
    """{kernel: registers} for every function with an EIATTR_REGCOUNT record; {} for a cubin without `.nv.info`.
    Raises CubinError for bytes that are not a cubin."""
    secs = {name: (off, size) for name, off, size in _sections(cubin)}
    if ".nv.info" not in secs or ".symtab" not in secs or ".strtab" not in secs:
        return {}
    sym_off, sym_size = secs[".symtab"]
    str_off = secs[".strtab"][0]
    names = [_cstr(cubin, str_off + struct.unpack_from("<I", cubin, sym_off + 24 * i)[0])
             for i in range(sym_size // 24)]
    off, size = secs[".nv.info"]
    out: dict[str, int] = {}
    p, end = off, off + size
    while p + 4 <= end:
        fmt, attr = cubin[p], cubin[p + 1]
        if fmt != EIFMT_SVAL:
            p += 4
            continue
        (n,) = struct.unpack_from("<H", cubin, p + 2)
        if attr == EIATTR_REGCOUNT and n == 8:
            sym, regs = struct.unpack_from("<II", cubin, p + 4)
            if sym < len(names):
                out[names[sym]] = regs
        p += 4 + n
    return out
