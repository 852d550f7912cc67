"""Chat templates render within bounds (issue 13, finding 7), and exactly as transformers renders them.

The hostile templates are the ways a template builds a huge prompt or loops forever inside Jinja's
sandbox; each is refused, with the memory of the rendering measured by ``tracemalloc``. The benign
ones use the constructs real chat templates use (namespaces, macros, loops with ``loop.*``,
``tojson``, whitespace control, set blocks, ``raise_exception``) and must render the same text
through the bounded compilation as through transformers' own.
"""

from __future__ import annotations

import contextvars
import os
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml
from transformers.utils import chat_template_utils

from eagle3_raw.errors import Interrupted, PromptFormatError
from eagle3_raw.limits import PROMPT_CHARS
from eagle3_raw.recipe import load_recipe
from eagle3_raw.resources import reference_model_dir
from eagle3_raw.run import template_limits
from eagle3_raw.run.render import Renderer
from eagle3_raw.run.template_limits import (
    BUILT_CHARS,
    CALLS,
    LOOP_STEPS,
    TemplateLimitError,
    guard_templates,
    interruptible,
)
from eagle3_raw.source.prompts import Conversation

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
    # issue 22, finding 4: what escaped the bounds above
    "an exponentially recursive macro": "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}"
    "{% endif %}{% endmacro %}{{ f(40) }}",
    "an endless recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "an allocation loop": "{% set ns = namespace(s='') %}{% for i in range(100000) %}"
    "{% set ns.s = 'x' * 16000000 %}{% endfor %}",
    "many values kept": "".join(f"{{% set v{i} = 'x' * 16000000 %}}" for i in range(300)),
    "a list doubled by literals": "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}"
    "{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}",
    "a dict doubled by literals": "{% set ns = namespace(d={}) %}{% for i in range(60) %}"
    "{% set ns.d = {'a': ns.d, 'b': ns.d} %}{% endfor %}{{ ns.d|tojson }}",
    "a tojson indent within the size limit": "{{ messages|tojson(indent=16000000) }}",
    "a tojson string indent": "{{ messages|tojson(indent=' ' * 1000000) }}",
    "an indent filter width": "{{ ('a\n' * 1000)|indent(16000000) }}",
    "a join separator": "{{ ('x' * 16000000).join(['a'] * 1000) }}",
    "a join filter separator": "{{ (['a'] * 1000)|join('x' * 16000000) }}",
    "a replace filter": "{{ ('x' * 1000000)|replace('x', 'y' * 100) }}",
    "expanded tabs": "{{ ('\t' * 1000).expandtabs(16000000) }}",
}  # fmt: skip

KEEPS = {"many values kept"}
"""Hostile templates that keep what they build until refused: bounded by BUILT_CHARS."""
SLOW = {"an exponentially recursive macro"}
"""Hostile templates whose harm is time (100,000 calls: tracemalloc would make them take a minute)."""


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_template_that_would_build_too_much_is_refused_within_bounded_memory(name: str) -> None:
    text = HOSTILE[name]
    guard_templates(text)  # compiling it folds nothing unchecked (10 ** 100000000 took minutes)
    template = chat_template_utils._compile_jinja_template(text)
    if name in SLOW:
        with pytest.raises(TemplateLimitError, match="the chat template"):
            template.render(**CONTEXT)
        return
    tracemalloc.start()
    try:
        with pytest.raises(TemplateLimitError, match="the chat template"):
            template.render(**CONTEXT)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    bound = BUILT_CHARS if name in KEEPS else 4 * PROMPT_CHARS
    assert peak < bound + 16 * MB, f"{name}: peak {peak / MB:.0f} MB"  # a 300 MB prompt: ~70


def test_nothing_is_folded_at_compile_time_in_the_renderers_checks(tmp_path: Path) -> None:
    """`{{ 10 ** 100000000 }}` folded by Jinja's optimizer while the recipe's template was checked."""
    (tmp_path / "fold.jinja").write_text("{{ 10 ** 100000000 }}{{ 'x'|center(16000000)|tojson(indent=64) }}")
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    raw = {"name": "t", "prompts": {"source": "prompts.jsonl"}, "model": {"chat_template": "fold.jinja"},
           "server": {"endpoints": ["http://127.0.0.1:9"]}, "sampling": {"max_new_tokens": 8}}  # fmt: skip
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(raw))
    renderer = Renderer(load_recipe(tmp_path / "r.yaml"))  # compiled and checked: nothing evaluated
    conversation = Conversation(0, "hi", ({"role": "user", "content": "hi"},), None)
    with pytest.raises(PromptFormatError, match="raises a number to a power too large"):
        renderer.render(conversation)


@pytest.mark.slow
def test_calls_are_counted_and_a_slow_loop_stops_at_its_cpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    counted = "{% for i in range(100000) %}{{ 'a'.upper() }}{% endfor %}{% for i in range(100000) %}" \
        "{{ 'b'.upper() }}{% endfor %}{{ 'c'.upper() }}"  # fmt: skip
    guard_templates(counted)
    with pytest.raises(TemplateLimitError, match=f"made more than {CALLS:,} calls"):
        chat_template_utils._compile_jinja_template(counted).render()
    monkeypatch.setattr(template_limits, "RENDER_SECONDS", 0.2)
    slow = "{% set s = 'x' * 8000000 %}{% for i in range(100000) %}{% if s.count('y') %}{% endif %}" \
        "{% endfor %}"  # fmt: skip
    guard_templates(slow)
    with pytest.raises(TemplateLimitError, match=r"rendered for more than 0 s of CPU time"):
        chat_template_utils._compile_jinja_template(slow).render()


def test_a_rendering_stops_when_the_build_is_interrupted() -> None:
    """Ctrl-C and SIGTERM set the build's stop event; a template rendering in a worker thread (the
    planner's, ``asyncio.to_thread``'s: they copy the build's context) then stops at its next step."""
    text = "{% for i in range(100000) %}{% if i == 1 %}{{ started() }}{% endif %}{% endfor %}"
    guard_templates(text)
    template = chat_template_utils._compile_jinja_template(text)
    stop, started = threading.Event(), threading.Event()
    outcome: list[BaseException] = []

    def mark() -> str:  # the rendering is under way: the test interrupts it now
        started.set()
        return ""

    with interruptible(stop):
        context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(_render_into, template, mark, stop, outcome))
    thread.start()
    assert started.wait(30)
    stop.set()
    thread.join(30)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], Interrupted), outcome
    assert "stopped while a chat template was rendering" in str(outcome[0])


def _render_into(template: Any, mark: Any, stop: threading.Event, outcome: list[BaseException]) -> None:
    """Render ``template``; after ``mark`` ran, every step waits for ``stop`` (a slow template)."""

    def started() -> str:
        mark()
        stop.wait(30)
        return ""

    try:
        template.render(started=started)
    except BaseException as exc:  # Interrupted is a KeyboardInterrupt
        outcome.append(exc)


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


@pytest.mark.slow
def test_ctrl_c_stops_a_build_while_its_template_renders(tmp_path: Path) -> None:
    """Issue 22, finding 4: Ctrl-C and SIGTERM were not honoured while a template rendered (the
    rendering ran on until it ended; one took 829 s). This one takes a minute of CPU per prompt."""
    import signal
    import subprocess
    import sys

    from tests.helpers import reference_server, write_prompts, write_recipe
    from tests.reference.wire import wait_until
    from tests.support.hostile import HostileServer

    slow = "{% set s = 'x' * 8000000 %}{% for i in range(100000) %}{% if s.count('y') %}{% endif %}" \
        "{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}"  # fmt: skip
    (tmp_path / "slow.jinja").write_text(slow)
    write_prompts(tmp_path, 2)
    with reference_server(tmp_path) as (server, _), HostileServer(worker=server.url) as front:
        recipe = write_recipe(tmp_path, endpoints=[front.url],
                              model={"chat_template": "slow.jinja", "render": "local"})  # fmt: skip
        build = subprocess.Popen(
            [sys.executable, "-m", "eagle3_raw.cli", "build", str(recipe), "--quiet", "--journal-dir",
             str(tmp_path / "j")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            wait_until(lambda: any(r.path == "/tokenize" for r in front.requests), timeout=90)  # checks began
            started = _cpu_seconds(build.pid)
            wait_until(lambda: _cpu_seconds(build.pid) > started + 2, timeout=90)  # rendering now
            build.send_signal(signal.SIGINT)
            _, err = build.communicate(timeout=30)  # the rendering alone would run for a minute more
        finally:
            build.kill()
    assert build.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
