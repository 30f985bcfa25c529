"""The CUDA safety check reads code as the preprocessor does: comments, splices, trigraphs and digraphs
cannot hide a directive or split a refused name, and real kernels are not refused."""

from __future__ import annotations

import pytest

from evo.build.nvrtc import BuildInput, compile_one
from evo.core.genome import Genome
from evo.templates.safety import cuda_problems, normalize_cuda
from evo.templates.render import render
from evo.core.status import Status
from evo.templates.template import load_templates

TEMPLATES = load_templates("rmsnorm")
KERNEL = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] = 1.f; }\n'


@pytest.mark.parametrize("source, expected", [
    ("??=define X 1", "#define X 1"),
    ("sys\\\ntem(", "system("),
    ("a/**/b", "a b"),
    ("a/* one\ntwo */b", "a b"),
    ("a // note\nb", "a  \nb"),
    ("// comment \\\n#include <stdio.h>\nb", " \nb"),  # the splice makes the include part of the comment
    ('s = "http://x"; // c', 's = "http://x";  '),
    ("c = '/'; d = '*'; /* x */", "c = '/'; d = '*';  "),
    ('asm("{ %0, %1 }" :: "r"(a), "r"(b)); x<:1:> = 2;', 'asm("{ %0, %1 }" :: "r"(a), "r"(b)); x[1] = 2;'),
    ("%:define C(a, b) a %:%: b", "#define C(a, b) a ## b"),
    ("<% return; %>", "{ return; }"),
    ("f<::g>(x); h<::>;", "f<::g>(x); h[];"),  # `<::` is `<` `::` unless `:` or `>` follows
    ("n = 1'000; /* gone */ m", "n = 1'000;   m"),  # a digit separator opens no character literal
    ("u8'a' /**/ L\"%:\" /**/ R", "u8'a'   L\"%:\"   R"),
], ids=["trigraph", "splice", "comment", "multiline-comment", "line-comment", "splice-in-comment",
        "slashes-in-string", "comment-chars-in-char-literals", "digraphs-outside-asm-string", "digraph-paste",
        "digraph-braces", "less-colon-colon", "digit-separator", "prefixed-literals"])
def test_normalize_cuda(source, expected):
    assert normalize_cuda(source) == expected


HOSTILE = {
    "comment-in-directive": ("#/**/include <stdio.h>", "#include <stdio.h>"),
    "multiline-comment-in-directive": ('#/*\n*/include "/etc/passwd"', '#include "/etc/passwd"'),
    "directive-after-multiline-comment": ('__device__ int a; /*\n*/ #include "/etc/passwd"', '#include "/etc/passwd"'),
    "spaced-hash": ('  #   include "/etc/passwd"', '#include "/etc/passwd"'),
    "vertical-tab": ('#\vinclude "/etc/passwd"', '#include "/etc/passwd"'),
    "splice-in-directive": ("#inc\\\nlude <stdio.h>", "#include <stdio.h>"),
    "splice-in-name": ('__device__ void f() { sys\\\ntem("id"); }', "host-side code: system"),
    "comment-after-name": ('__device__ void f() { system/**/("id"); }', "host-side code: system"),
    "digraph-include": ("%:include <stdio.h>", "#include <stdio.h>"),
    "digraph-embed": ('%:embed "/etc/passwd"', "preprocessor directive #embed"),
    "paste-system": ('#define CAT(a, b) a##b\n__device__ void f() { CAT(sys, tem)("id"); }', "token pasting ##"),
    "paste-popen": ("#define CAT(a, b) a ## b\n__device__ void* p = (void*)CAT(po, pen);", "token pasting ##"),
    "digraph-paste": ("#define CAT(a, b) a %:%: b\n__device__ int CAT(sys, tem);", "token pasting ##"),
    "separator-then-paste": ("__device__ int n = 1'0; %:define CAT(a, b) a %:%: b", "token pasting ##"),
    "trigraph-directive": ("??=include <stdio.h>", "trigraph ??="),
    "trigraph-splice": ('__device__ void f() { sys??/\ntem("id"); }', "trigraph ??/"),
    "has-include": ('#if __has_include("/etc/passwd")\n__device__ int found;\n#endif', "preprocessor operator __has_include"),
    "has-include-next": ("#if __has_include_next(<stdio.h>)\n#endif", "preprocessor operator __has_include_next"),
    "include-next": ("#include_next <stdio.h>", "preprocessor directive #include_next"),
    "import": ('#import "/etc/passwd"', "preprocessor directive #import"),
    "line": ('#line 1 "/etc/passwd"', "preprocessor directive #line"),
    "linemarker": ('# 1 "/etc/passwd"', "preprocessor directive '# 1"),
    "pragma-operator": ('_Pragma("GCC dependency \\"/etc/passwd\\"")', "preprocessor operator _Pragma"),
    "msvc-pragma": ("__pragma(once)", "preprocessor operator __pragma"),
    "pragma-dependency": ('#pragma GCC dependency "/etc/passwd"', '#pragma GCC dependency "/etc/passwd"'),
    "pragma-message": ('#pragma message("x")', "#pragma message"),
    "pragma-push-macro": ('#pragma push_macro("X")', "#pragma push_macro"),
    "pragma-unroll-string": ('#pragma unroll "/etc/passwd"', "#pragma unroll"),
    "extern-system": ('extern "C" int system(const char*);', "extern declaration of host function system"),
    "extern-parenthesized": ('extern "C" int (popen)(const char*, const char*);', "extern declaration of host function popen"),
    "extern-block": ('extern "C" {\nint x;\nint fork(void);\n}', "extern declaration of host function fork"),
    "universal-character-name": ("__device__ int \\u0073ystem;", "backslash outside a literal"),
    "raw-string": ('__device__ const char* s = R"(\n#include "a"\n)";', "raw string literal"),
    "lone-carriage-return": ('// c\r#include "/etc/passwd"', "control character '\\r'"),
    "backslash-space-newline": ("#inc\\  \nlude <stdio.h>", "backslash followed by spaces"),
    "unterminated-string": ('__device__ const char* s = "abc\n#define X', "unterminated literal"),
    "unterminated-comment": ("__device__ int a; /* never closed", "unterminated /* comment"),
    "quote-in-char-literal": ("__device__ char c = '\"'; // \"\n#include \"/etc/passwd\"", '#include "/etc/passwd"'),
}


@pytest.mark.parametrize("code, why", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_code_is_refused(code, why):
    problems = cuda_problems(code + "\n" + KERNEL)
    assert any(why in p for p in problems), problems


@pytest.fixture(scope="module")
def secret(tmp_path_factory):
    path = tmp_path_factory.mktemp("secret") / "secret.h"
    path.write_text("KF_SECRET_TOKEN_7f3a\n")
    return path


def _nvrtc_log(source: str) -> str:
    g = Genome.make("rmsnorm", "probe", "0" * 64, {})
    r = compile_one(BuildInput(g, "sm_90a", (), (), source, ("k",), 32))
    return r.log


LEAKS = {
    "multiline-comment-in-directive": '#/*\n*/include "{}"',
    "directive-after-multiline-comment": '__device__ int a; /*\n*/ #include "{}"',
    "digraph-include": '%:include "{}"',
    "vertical-tab": '#\vinclude "{}"',
    "splice-in-directive": '#inc\\\nlude "{}"',
    "include-next": '#include_next "{}"',
}


@pytest.mark.parametrize("code", LEAKS.values(), ids=LEAKS.keys())
def test_refused_includes_really_read_files_with_nvrtc(code, secret):
    # Each spelling makes real NVRTC read the file into its log: the refusal is what stops the leak.
    source = code.format(secret) + "\n" + KERNEL
    assert "KF_SECRET_TOKEN_7f3a" in _nvrtc_log(source)
    assert any(str(secret) in p for p in cuda_problems(source)), cuda_problems(source)


def _renders():
    dtypes = ("bfloat16", "float16", "float32")
    for name, t in sorted(TEMPLATES.items()):
        for dt in dtypes:
            yield f"{name}-{dt}-defaults", t, dict(t.default_params(), vec=4 if dt == "float32" else 8), dt
        space = dict(t.space)  # the cache-hint axes a template has (rows_bulk loads by bulk copies: no load_hint)
        for load in space.get("load_hint", (None,)):
            for store in space.get("store_hint", (None,)):
                hints = {k: v for k, v in (("load_hint", load), ("store_hint", store)) if v is not None}
                if t.is_valid(dict(t.default_params(), **hints), 90, {"x": "bfloat16", "w": "bfloat16"}):
                    yield f"{name}-bfloat16-{load}-{store}", t, dict(t.default_params(), **hints), "bfloat16"


RENDERS = list(_renders())


@pytest.mark.parametrize("tdef, params, dt", [r[1:] for r in RENDERS], ids=[r[0] for r in RENDERS])
def test_rendered_templates_are_not_refused(tdef, params, dt):
    r = render(tdef, params, 90, {"x": dt, "w": dt}, tdef.consts({"N": 4096}))
    assert r.status is Status.OK and "asm" in r.source and "#pragma unroll" in r.source
    assert cuda_problems(r.source) == []


def test_ordinary_device_code_is_not_refused():
    code = """#include <cuda_fp16.h>
// Comments may say anything: system("x"), #include <stdio.h>, a ## b, /etc/passwd.
/* even across
   lines: _Pragma("once") fork() */
#define STR(x) #x
#define VEC 4
#if defined(VEC) && VEC > 2
#undef VEC
#define VEC 8
#elif 0
#error unreachable
#else
#endif
#ifdef VEC
#endif
static_assert(sizeof(int) == 4, "see https://example.com // not a comment /* nor this */");
struct Unit {};
template <typename T> struct S { T v; };
__device__ S<::Unit> s;
__device__ const char c = '/';
__device__ const unsigned big = 1'000'000u;
extern "C" __global__ void k2(float* y) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) y[i] = 0.f;
#pragma unroll 4
  for (int i = 0; i < 16; ++i) y[i] += 1.f;
#pragma unroll (VEC / 2)
  for (int i = 0; i < VEC; ++i) y[i] *= 2.f;
#pragma nounroll
  for (int i = 0; i < 3; ++i) asm volatile("{ .reg .u32 t; mov.u32 t, %0; }" :: "r"(i));
}
"""
    assert cuda_problems(code + KERNEL) == []
    log = _nvrtc_log(code + KERNEL)
    assert "error" not in log.lower(), log  # and it is code NVRTC accepts
