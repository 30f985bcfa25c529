"""Each kind of template injection or host code an LLM answer might carry is refused, with its reason."""

from __future__ import annotations

import pytest

from evo.llm.mutate import read_proposal
from evo.templates.safety import cuda_problems, declaration_problems, template_problems
from evo.core.status import Status
from evo.templates.template import load_templates, parse_template
from tests.unit.fake_llm_server import edits, parent_request, whole

TEMPLATES = load_templates("rmsnorm")
KERNEL = 'extern "C" __global__ void rmsnorm_warp_row(float* y) { y[threadIdx.x] = {{ threads }}; }\n'
HEADER = """{#- kfactory
[template]
op = "rmsnorm"
name = "probe"
[space]
threads = [128, 256]
[defaults]
threads = 128
[[launch]]
kernel = "rmsnorm_warp_row"
grid = ["M"]
block = ["threads"]
args = ["y"]
-#}
"""


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_real_templates_pass(name):
    t = TEMPLATES[name]
    assert template_problems(t.text) == [] and declaration_problems(t) == []


INJECTIONS = {
    "class-mro": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "__class__"),
    "globals": ("{{ cycler.__init__.__globals__.os.popen('id').read() }}", "__globals__"),
    "subclasses-item": ("{{ threads['__subclasses__'] }}", "__subclasses__"),
    "builtins": ("{% set b = self.__builtins__ %}", "__builtins__"),
    "dunder-import": ("{{ x.__import__('os') }}", "__import__"),
    "attr-filter": ("{{ threads|attr('_' ~ '_class_' ~ '_') }}", "'attr' filter"),
    "private-attr": ("{{ threads._secret }}", "attribute access to '_secret'"),
    "lipsum": ("{{ lipsum }}", "Jinja global 'lipsum'"),
    "include-etc": ('{% include "/etc/passwd" %}', "only '_macros/...'"),
    "include-dotdot": ('{% include "_macros/../../evo/core/config.py" %}', "only '_macros/...'"),
    "include-computed": ("{% include threads ~ '.j2' %}", "computed name"),
    "import-other": ('{% import "rmsnorm/cta_row.cu.j2" as other %}', "import"),
    "from-import": ('{% from "os.j2" import system %}', "from-import"),
    "extends": ('{% extends "rmsnorm/cta_row.cu.j2" %}', "extends"),
    "syntax": ("{% if %}", "Jinja syntax error"),
}


@pytest.mark.parametrize("body, why", INJECTIONS.values(), ids=INJECTIONS.keys())
def test_jinja_injection_is_refused(body, why):
    problems = template_problems(HEADER + body + "\n" + KERNEL)
    assert problems and any(why in p for p in problems), problems


def test_macro_include_is_allowed():
    assert template_problems(HEADER + '{% include "_macros/memory.cuh.j2" %}\n' + KERNEL) == []
    assert template_problems(HEADER + '{% import "_macros/memory.cuh.j2" as m %}\n' + KERNEL) == []


HOST = {
    "stdio": ("#include <stdio.h>", "#include <stdio.h>"),
    "etc-passwd": ('#include "/etc/passwd"', "#include \"/etc/passwd\""),
    "cuda-std-dotdot": ("#include <cuda/std/../../../etc/passwd>", "#include"),
    "macro-include": ("#include HEADER_NAME", "#include HEADER_NAME"),
    "system": ('__device__ void f() { system("id"); }', "host-side code: system"),
    "popen": ("__device__ void* f() { return (void*)popen; }", "popen"),
    "fopen": ('__device__ void f() { fopen("/etc/passwd", "r"); }', "fopen"),
    "asm-syscall": ('__device__ void f() { asm volatile("syscall"); }', "syscall"),
    "host-function": ("__host__ void helper() {}", "__host__"),
    "main": ("int main() { return 0; }", "host-side code: main"),
    "embed": ("#embed </etc/passwd>", "#embed"),
    "fork-by-address": ("__device__ void* p = (void*)&fork;", "host-side code: fork"),
}


@pytest.mark.parametrize("code, why", HOST.values(), ids=HOST.keys())
def test_host_code_is_refused(code, why):
    problems = template_problems(HEADER + code + "\n" + KERNEL)
    assert any(why in p for p in problems), problems


def test_cuda_headers_are_allowed():
    code = "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cuda_runtime.h>\n#include <cuda/std/cstdint>\n"
    assert cuda_problems(code + KERNEL) == []


def test_launch_of_an_undefined_kernel_is_refused():
    t = parse_template(HEADER + 'extern "C" __global__ void some_other_kernel(float* y) {}\n', "t")
    assert declaration_problems(t) == ["[[launch]] names kernels the template does not define: ['rmsnorm_warp_row']"]


def test_injection_in_a_header_expression_is_refused():
    text = HEADER.replace('grid = ["M"]', "grid = [\"M.__class__.__mro__\"]") + KERNEL
    assert any("__class__" in p for p in template_problems(text))
    t = parse_template(HEADER.replace('grid = ["M"]', 'grid = ["M|attr(\'x\')"]') + KERNEL, "t")
    assert any("'attr' filter" in p for p in declaration_problems(t))


def test_answers_carrying_injection_are_llm_errors():
    req = parent_request()
    evil = req.template_text.replace("{% set XB", "{{ ''.__class__.__mro__ }}\n{% set XB", 1)
    status, text, reason = read_proposal(whole(evil), req)
    assert (status, text) == (Status.LLM_ERROR, None) and "unsafe template" in reason and "__class__" in reason
    status, _, reason = read_proposal(edits(("#pragma unroll\n      for (int i = 0; i < {{ cache_items }}; ++i) {\n"
                                             "        const int v = lane + 32 * i;\n        if (v < nvec) {\n"
                                             "          kf::load<{{ XB }}, true>",
                                             '#include "/etc/passwd"\n#pragma unroll\n      for (int i = 0; '
                                             "i < {{ cache_items }}; ++i) {\n        const int v = lane + 32 * i;\n"
                                             "        if (v < nvec) {\n          kf::load<{{ XB }}, true>")), req)
    assert status is Status.LLM_ERROR and "/etc/passwd" in reason


def test_include_built_by_jinja_is_caught_in_the_rendered_source():
    # Static checks cannot see '#include' assembled from Jinja strings; the rendered defaults are checked too.
    req = parent_request()
    sneaky = req.template_text.replace('{% include "_macros/memory.cuh.j2" %}',
                                       '{% include "_macros/memory.cuh.j2" %}\n{{ "#" ~ "inc" ~ "lude" }} <stdio.h>')
    status, _, reason = read_proposal(whole(sneaky), req)
    assert status is Status.LLM_ERROR and "unsafe rendered CUDA" in reason and "<stdio.h>" in reason
    # a directive whose name Jinja computes is refused before rendering
    half = sneaky.replace('{{ "#" ~ "inc" ~ "lude" }}', '#{{ "inc" ~ "lude" }}')
    status, _, reason = read_proposal(whole(half), req)
    assert status is Status.LLM_ERROR and reason.startswith("unsafe template: preprocessor directive '# {{")
