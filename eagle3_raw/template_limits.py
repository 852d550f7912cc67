"""Chat templates render within bounds: a stranger's template cannot exhaust memory or CPU.

A chat template is code, and it may come from a stranger (a published recipe, a Hub tokenizer).
Jinja's sandbox stops it from touching Python internals, not from building a 300 MB prompt or
looping for an hour. :func:`guard_templates` compiles each template eagle3_raw renders a second
time, in an overlay of transformers' own environment (same options, filters, globals and
extensions, so the text rendered is the same), with these limits per rendering:

- the output: at most :data:`~eagle3_raw.limits.PROMPT_CHARS` characters, counted as it is
  produced, macros and ``{% set %}`` blocks included;
- loops: at most :data:`LOOP_STEPS` iterations in all;
- one value: a string or a list built by ``*``, ``**``, ``%``, ``+``, ``~``, a call or a filter is
  refused above :data:`~eagle3_raw.limits.PROMPT_CHARS` characters; where the size shows in the
  operands (a repetition count, an integer width, a power), before it is built.

Crossing one raises :class:`TemplateLimitError`, a Jinja ``SecurityError``: the row is skipped with
that reason, like any other template refusal. What is left: an operation whose result size does
not show in its operands (a ``str.format`` width computed inside the template) can allocate once,
up to that size, before it is refused.

transformers renders through ``chat_template_utils._compile_jinja_template`` (private, pinned with
transformers' major version); it is wrapped once so that the templates given to
:func:`guard_templates`, and only those, render from the bounded compilation.
"""

from __future__ import annotations

import contextvars
import functools
import re
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment
from jinja2.visitor import NodeTransformer

from eagle3_raw.errors import RecipeError
from eagle3_raw.limits import PROMPT_CHARS, TEMPLATE_BYTES

if TYPE_CHECKING:
    from jinja2 import Template

LOOP_STEPS = 200_000
"""Loop iterations allowed in one rendering (a long conversation with tools takes thousands)."""

_POWER_BITS = 1 << 20


class TemplateLimitError(SecurityError):
    """A chat template crossed one of the bounds of one rendering."""


@dataclass
class _Budget:
    output: int = 0
    steps: int = 0


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("eagle3_raw_template", default=None)
_GUARDED: dict[str, Template] = {}


def guard_templates(template: str | Mapping[str, str] | None) -> None:
    """Make every rendering of ``template`` (a tokenizer's ``chat_template``: one text, or named
    ones) bounded; RecipeError when one is longer than :data:`~eagle3_raw.limits.TEMPLATE_BYTES`."""
    texts = [template] if isinstance(template, str) else list((template or {}).values())
    _install()
    for text in texts:
        if len(text) > TEMPLATE_BYTES:
            shown = f"<{len(text):,} characters>"
            raise RecipeError("model.chat_template", shown, f"a chat template of at most {TEMPLATE_BYTES:,}")
        if text not in _GUARDED:
            _GUARDED[text] = _compile(text)


def _install() -> None:
    from transformers.utils import chat_template_utils as utils

    original = utils._compile_jinja_template
    if getattr(original, "eagle3_raw_guard", False):
        return

    def compile_template(chat_template: str) -> Any:
        guarded = _GUARDED.get(chat_template)
        return guarded if guarded is not None else original(chat_template)

    compile_template.eagle3_raw_guard = True  # type: ignore[attr-defined]
    utils._compile_jinja_template = compile_template  # type: ignore[assignment]


def _compile(text: str) -> Template:
    """``text`` compiled in a bounded overlay of the environment transformers compiles it in."""
    env: Any = _base_environment().overlay()
    env.intercepted_binops = frozenset({"*", "**", "%", "+"})
    env.call_binop = types.MethodType(_binop, env)
    env.call = types.MethodType(_call, env)
    env.concat = _concat
    env.filters = {name: _bounded_filter(f) for name, f in env.filters.items()}
    env.globals = {**env.globals, "lipsum": _no_lipsum}
    env.e3_out, env.e3_each, env.e3_value = _out, _each, _checked
    tree = _Instrument().visit(env.parse(text))
    tree.set_environment(env)
    template: Template = env.template_class.from_code(env, env.compile(tree), env.make_globals(None), None)
    return template


@functools.cache
def _base_environment() -> Any:
    """transformers' chat template environment (compiled from an empty template: compiling the
    template itself there would fold its constants, ``{{ 10 ** 100000000 }}`` included, unchecked)."""
    from transformers.utils import chat_template_utils as utils

    return utils._cached_compile_jinja_template("").environment


class _Instrument(NodeTransformer):
    """Every output piece counted, every loop iteration counted, every ``~`` checked. The hooks
    are attributes of the environment, which a template cannot reach or shadow."""

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
        node.nodes = [_hook("e3_out", child) for child in node.nodes]
        return node

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _hook("e3_each", node.iter)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _hook("e3_value", node)


def _hook(name: str, argument: nodes.Node) -> nodes.Call:
    call = nodes.Call(nodes.EnvironmentAttribute(name), [argument], [], None, None)
    call.set_lineno(argument.lineno)
    return call


# --- the budget of one rendering ------------------------------------------------------------------


def _concat(parts: Iterable[str]) -> str:
    """``"".join``; the outermost call (``Template.render``) opens the rendering's budget."""
    if _BUDGET.get() is not None:
        return "".join(parts)
    token = _BUDGET.set(_Budget())
    try:
        return "".join(parts)
    finally:
        _BUDGET.reset(token)


def _out(value: Any) -> Any:
    budget = _BUDGET.get()
    if budget is not None:
        budget.output += _size(value)
        if budget.output > PROMPT_CHARS:
            raise TemplateLimitError(f"the chat template wrote more than {PROMPT_CHARS:,} characters")
    return value


class _Counted:
    """An iterable whose iterations are charged to the rendering's budget."""

    def __init__(self, iterable: Any) -> None:
        self._iterable = iterable

    def __len__(self) -> int:
        return len(self._iterable)  # TypeError for an unsized one, as jinja's LoopContext expects

    def __iter__(self) -> Iterator[Any]:
        budget = _BUDGET.get()
        for item in self._iterable:
            if budget is not None:
                budget.steps += 1
                if budget.steps > LOOP_STEPS:
                    raise TemplateLimitError(f"the chat template looped more than {LOOP_STEPS:,} times")
            yield item


def _each(iterable: Any) -> _Counted:
    return _Counted(iterable)


# --- values ------------------------------------------------------------------------------------------


def _size(value: Any) -> int:
    """Characters ``value`` stands for: a string's length; a container's items and the lengths of
    the strings and containers in it (one level); 16 for anything else."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        value = [*value.keys(), *value.values()]
    if isinstance(value, list | tuple | set | frozenset):
        return len(value) + sum(len(v) if isinstance(v, str | list | tuple | dict) else 1 for v in value)
    return 16


def _checked(value: Any) -> Any:
    if _size(value) > PROMPT_CHARS:
        raise TemplateLimitError(f"the chat template built a value of more than {PROMPT_CHARS:,} characters")
    return value


def _refuse(what: str) -> NoReturn:
    raise TemplateLimitError(f"the chat template {what} (a rendering may build {PROMPT_CHARS:,} characters)")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_NUMBER = re.compile(r"\d{7,}")


def _wide(fmt: str) -> bool:
    """True when a format string holds a number above the limit (a field width, a precision)."""
    return any(int(number) > PROMPT_CHARS for number in _NUMBER.findall(fmt))


def _binop(env: SandboxedEnvironment, context: Any, operator: str, left: Any, right: Any) -> Any:
    if operator == "*":
        count, sequence = (left, right) if _is_int(left) else (right, left)
        repeated = isinstance(sequence, str | list | tuple) and _is_int(count)
        if repeated and count * _size(sequence) > PROMPT_CHARS:
            _refuse(f"repeats a value {count:,} times")
    elif operator == "**" and _is_int(left) and _is_int(right) and right > 0:
        if abs(left).bit_length() * right > _POWER_BITS:
            _refuse("raises a number to a power too large to build")
    elif operator == "%" and isinstance(left, str):
        widths = right if isinstance(right, tuple) else (right,)
        if _wide(left) or any(_is_int(w) and w > PROMPT_CHARS for w in widths):
            _refuse("formats a field too wide")
    return _checked(env.binop_table[operator](left, right))


def _call(env: SandboxedEnvironment, context: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
    if obj in _HOOKS:  # ours (see _Instrument): a printed number is no size
        return obj(*args)
    if any(_is_int(a) and a > PROMPT_CHARS for a in (*args, *kwargs.values())):
        _refuse("passes a size too large to a call")
    owner = getattr(getattr(obj, "__wrapped__", obj), "__self__", None)  # the sandbox wraps str.format
    if isinstance(owner, str):
        _check_string_method(owner, getattr(obj, "__name__", ""), args)
    return _checked(SandboxedEnvironment.call(env, context, obj, *args, **kwargs))


def _check_string_method(text: str, name: str, args: tuple[Any, ...]) -> None:
    if name in ("format", "format_map") and _wide(text):
        _refuse("formats a field too wide")
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        hits = text.count(args[0]) if args[0] else len(text) + 1
        if len(text) + hits * len(args[1]) > PROMPT_CHARS:
            _refuse("replaces into a string too long")


def _bounded_filter(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with its size arguments checked before and its result after. The first
    positional argument (after the context or environment jinja passes some filters) is the
    filtered value, left alone: a large number may well be printed."""
    skip = 2 if hasattr(function, "jinja_pass_arg") else 1

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        if any(_is_int(a) and a > PROMPT_CHARS for a in (*args[skip:], *kwargs.values())):
            _refuse(f"passes a size too large to the {getattr(function, '__name__', '')} filter")
        return _checked(function(*args, **kwargs))

    return bounded


_HOOKS = (_out, _each, _checked)


def _no_lipsum(*args: Any, **kwargs: Any) -> str:
    raise TemplateLimitError("the chat template calls lipsum(), which no chat template needs")


__all__ = ["LOOP_STEPS", "TemplateLimitError", "guard_templates"]
