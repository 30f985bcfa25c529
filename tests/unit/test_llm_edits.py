"""Reading a model's answer: whole templates in fences, SEARCH/REPLACE edits, and their errors."""

from __future__ import annotations

import pytest

from evo.llm.edits import Edit, EditError, apply_edits, extract_template, new_template_text, parse_edits
from tests.unit.fake_llm_server import edits, whole

PARENT = """{#- kfactory
[template]
op = "rmsnorm"
-#}
int f(int a) {
  if (a > 0) {
    return a * 2;
  }
  return 0;
}
int g(int b) {
  return 0;
}
"""


def test_one_exact_edit():
    out = new_template_text(edits(("    return a * 2;", "    return a * 3;")), PARENT)
    assert "return a * 3;" in out and "return a * 2;" not in out
    assert out.count("return 0;") == 2


def test_several_edits_apply_in_order():
    ans = edits(("    return a * 2;", "    return a * 4;"), ("    return a * 4;", "    return a << 2;"))
    assert "return a << 2;" in new_template_text(ans, PARENT)


def test_whitespace_tolerant_match_reindents_the_replacement():
    # The model dropped the indentation and doubled a space; the match still lands, re-indented.
    ans = edits(("if (a > 0)  {\n  return a * 2;\n}", "if (a >= 1) {\n  return a + a;\n}"))
    out = new_template_text(ans, PARENT)
    assert "  if (a >= 1) {\n    return a + a;\n  }\n" in out


def test_crlf_and_fenced_edits_parse():
    ans = "```\r\n<<<<<<< SEARCH\r\n    return a * 2;\r\n=======\r\n    return -a;\r\n>>>>>>> REPLACE\r\n```\r\n"
    assert "return -a;" in new_template_text(ans, PARENT)


def test_search_not_found_names_the_edit():
    with pytest.raises(EditError, match=r"edit 2/2: SEARCH text not found.*nothing_like_this"):
        new_template_text(edits(("    return a * 2;", "    return 1;"), ("nothing_like_this();", "x")), PARENT)


def test_ambiguous_search_is_an_error():
    with pytest.raises(EditError, match=r"ambiguous, it matches 2 places"):
        new_template_text(edits(("  return 0;", "  return 1;")), PARENT)
    with pytest.raises(EditError, match=r"ambiguous, it matches 2 places"):
        apply_edits(PARENT, [Edit("return 0;\n}", "return 1;\n}")])


@pytest.mark.parametrize("answer, why", [
    ("<<<<<<< SEARCH\nx\n=======\ny\n", "not terminated"),
    ("<<<<<<< SEARCH\nx\n>>>>>>> REPLACE\n", "no '======='"),
    (">>>>>>> REPLACE\n", "without a '<<<<<<< SEARCH'"),
    ("<<<<<<< SEARCH\n\n=======\ny\n>>>>>>> REPLACE\n", "empty SEARCH"),
], ids=["unterminated", "no-divider", "stray-replace", "empty-search"])
def test_malformed_edit_blocks(answer, why):
    with pytest.raises(EditError, match=why):
        new_template_text(answer, PARENT)


def test_whole_template_in_jinja_or_cuda_fence():
    for lang in ("jinja", "cuda", ""):
        assert new_template_text(whole(PARENT, lang), "parent") == PARENT
    # The last whole template wins when a model shows a draft first.
    draft = PARENT.replace("a * 2", "a * 5")
    assert "a * 5" not in new_template_text(whole(draft) + "Better:\n" + whole(PARENT), "parent")


def test_unfenced_whole_template_is_accepted():
    assert extract_template(PARENT) == PARENT


@pytest.mark.parametrize("answer, why", [
    ("```cuda\n__global__ void k() {}\n```\n", "not a whole template"),
    ("```jinja\n{#- kfactory\n[template]\n", "unterminated ``` block"),
    ("I would change the block size.", "neither a whole template"),
], ids=["no-header", "cut-off", "prose-only"])
def test_answers_without_a_template(answer, why):
    with pytest.raises(EditError, match=why):
        new_template_text(answer, PARENT)


def test_markdown_rule_outside_edits_is_ignored():
    ans = "Plan\n=======\n\n" + edits(("    return a * 2;", "    return a;"))
    assert len(parse_edits(ans)) == 1
