"""Chat templates render within bounds (issue 13, finding 7), and exactly as transformers renders them.

The hostile templates are the ways a template builds a huge prompt or loops forever inside Jinja's
sandbox; each is refused, with the memory of the rendering measured by ``tracemalloc``. The benign
ones use the constructs real chat templates use (namespaces, macros, loops with ``loop.*``,
``tojson``, whitespace control, set blocks, ``raise_exception``) and must render the same text
through the bounded compilation as through transformers' own.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml
from transformers.utils import chat_template_utils

from eagle3_raw.errors import PromptFormatError
from eagle3_raw.limits import PROMPT_CHARS
from eagle3_raw.prompts import Conversation
from eagle3_raw.recipe import load_recipe
from eagle3_raw.render import Renderer
from eagle3_raw.resources import reference_model_dir
from eagle3_raw.template_limits import LOOP_STEPS, TemplateLimitError, guard_templates

MB = 1 << 20

TEMPLATES = Path(__file__).parent / "data" / "templates"
BENIGN = sorted(TEMPLATES.glob("*.jinja"))
"""Written for these tests in the manner of Llama 3.1's and Qwen3's templates, and with the odds and
ends of Jinja real templates use (recursion, ``dictsort``, ``selectattr``, ``format``, for-else)."""

CONTEXT: dict[str, Any] = {
    "messages": [
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4", "reasoning_content": "add"},
        {"role": "user", "content": "And the weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": '{"temp": 21}'},
        {"role": "user", "content": "Thanks"},
    ],
    "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
    "add_generation_prompt": True,
    "bos_token": "<s>",
    "enable_thinking": False,
}  # fmt: skip


def _transformers_render(text: str, context: dict[str, Any]) -> str:
    """The text as transformers' own environment renders it (never the bounded compilation)."""
    return str(chat_template_utils._cached_compile_jinja_template(text).render(**context))


@pytest.mark.parametrize("path", BENIGN, ids=lambda p: p.stem)
def test_benign_templates_render_exactly_as_transformers_renders_them(path: Path) -> None:
    text = path.read_text()
    expected = _transformers_render(text, CONTEXT)
    guard_templates(text)
    assert chat_template_utils._compile_jinja_template(text).render(**CONTEXT) == expected
    assert len(expected) > 50  # it rendered something (the templates are exercised, not skipped)


def test_the_reference_template_renders_the_same_through_the_tokenizer() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(reference_model_dir()))
    for thinking in (True, False):
        kwargs = {"enable_thinking": thinking, "tokenize": False, "add_generation_prompt": True}
        messages = [m for m in CONTEXT["messages"] if m["role"] != "tool"]
        context = {**CONTEXT, "messages": messages, "enable_thinking": thinking}
        context.update({k: getattr(tokenizer, k) for k in ("bos_token", "eos_token", "pad_token")})
        expected = _transformers_render(tokenizer.chat_template, context)
        guard_templates(tokenizer.chat_template)
        guarded = chat_template_utils._compile_jinja_template(tokenizer.chat_template)
        assert guarded.render(**context) == expected
        assert tokenizer.apply_chat_template(messages, tools=CONTEXT["tools"], **kwargs)


HOSTILE = {
    "a 300 MB prompt from a loop": "{% for i in range(100000) %}{{ 'x' * 3000 }}{% endfor %}",
    "a loop in a macro": "{% macro m() %}{% for i in range(100000) %}" + "y" * 3000
    + "{% endfor %}{% endmacro %}{{ m() }}",
    "a loop in a set block": "{% set s %}{% for i in range(100000) %}{{ 'z' * 3000 }}{% endfor %}"
    "{% endset %}{{ s|length }}",
    "one repetition": "{{ 'x' * 300000000 }}",
    "a list repetition": "{% set l = ['x' * 1000000] * 300 %}{{ l|length }}",
    "doubling with ~": "{% set ns = namespace(s='0123456789abcdef') %}{% for i in range(40) %}"
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "doubling with +": "{% set ns = namespace(s='0123456789abcdef') %}{% for i in range(40) %}"
    "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "a filter width": "{{ 'x'|center(300000000) }}",
    "a tojson indent": "{{ messages|tojson(indent=300000000) }}",
    "a method width": "{{ 'x'.ljust(300000000) }}",
    "a format width": "{{ '{:>300000000}'.format(1) }}",
    "a %-format width": "{{ '%300000000d' % 1 }}",
    "a %-format star width": "{{ '%*d' % (300000000, 1) }}",
    "a huge replace": "{% set s = 'x' * 1000000 %}{{ s.replace('x', 'y' * 100) }}",
    "a huge power": "{{ 10 ** 100000000 }}",
    "lipsum": "{{ lipsum(1000000) }}",
}  # fmt: skip


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_template_that_would_build_too_much_is_refused_within_bounded_memory(name: str) -> None:
    text = HOSTILE[name]
    guard_templates(text)  # compiling it folds nothing unchecked (10 ** 100000000 took minutes)
    template = chat_template_utils._compile_jinja_template(text)
    tracemalloc.start()
    try:
        with pytest.raises(TemplateLimitError, match="the chat template"):
            template.render(**CONTEXT)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * PROMPT_CHARS + 16 * MB, f"{name}: peak {peak / MB:.0f} MB"  # a 300 MB prompt: ~70


def test_loops_stop_at_their_step_budget() -> None:
    text = "{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}"
    guard_templates(text)
    with pytest.raises(TemplateLimitError, match=f"looped more than {LOOP_STEPS:,} times"):
        chat_template_utils._compile_jinja_template(text).render(**CONTEXT)


def test_large_numbers_may_still_be_printed() -> None:
    text = "{{ 123456789012 }} {{ 98765432109|string }} {{ [1, 2] * 3 }}"
    guard_templates(text)
    assert (
        chat_template_utils._compile_jinja_template(text).render()
        == "123456789012 98765432109 [1, 2, 1, 2, 1, 2]"
    )


def test_a_hostile_template_file_skips_the_rows_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "evil.jinja").write_text(HOSTILE["a 300 MB prompt from a loop"])
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    raw = {"name": "t", "prompts": {"source": "prompts.jsonl"}, "model": {"chat_template": "evil.jinja"},
           "server": {"endpoints": ["http://127.0.0.1:9"]}, "sampling": {"max_new_tokens": 8}}  # fmt: skip
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(raw))
    renderer = Renderer(load_recipe(tmp_path / "r.yaml"))
    conversation = Conversation(0, "hi", ({"role": "user", "content": "hi"},), None)
    tracemalloc.start()
    try:
        with pytest.raises(
            PromptFormatError, match=r"row 'hi' turn 1: .*wrote more than 16,777,216 characters"
        ):
            renderer.render(conversation)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * PROMPT_CHARS + 16 * MB
