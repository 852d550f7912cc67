"""Chat templates render within bounds: a stranger's template cannot exhaust memory or CPU.

A chat template is code, and it may come from a stranger (a published recipe, a Hub tokenizer).
Jinja's sandbox stops it from touching Python internals, not from building a 300 MB prompt or
looping for an hour. :func:`guard_templates` compiles each template eagle3_raw renders a second
time, in an overlay of transformers' own environment (same options, filters, globals and
extensions, so the text rendered is the same), with these limits per rendering:

- the output: at most :data:`~eagle3_raw.limits.PROMPT_CHARS` characters, counted as it is
  produced, macros and ``{% set %}`` blocks included;
- loops: at most :data:`LOOP_STEPS` iterations in all;
- calls (macros, methods, globals): at most :data:`CALLS` in all and :data:`CALL_DEPTH` nested (an
  exponentially recursive macro stops at the first, an endless recursion at the second);
- one value: a string, list, tuple or dict built by ``*``, ``**``, ``%``, ``+``, ``~``, a literal,
  a call or a filter is refused above :data:`~eagle3_raw.limits.PROMPT_CHARS` characters, counted
  through nested containers (``[x, x]`` counts ``x`` twice: doubling a list in a loop is refused);
  where the size shows in the operands (a repetition count, a width, a power, a separator joined
  between many items, a ``tojson`` or ``indent`` width times the lines it indents), before it is
  built;
- everything built: at most :data:`BUILT_CHARS` characters in all (allocation loops stop there);
- time: at most :data:`RENDER_SECONDS` of the rendering thread's CPU time (checked at every loop
  step, call, filter and output: a loop of bounded but slow operations stops there too).

Nothing is folded at compile time: the overlay compiles without Jinja's optimizer, which would
evaluate constant expressions (``{{ 10 ** 100000000 }}``, a filter of constants) while compiling,
outside every bound; transformers' own environment is never given the template
(:func:`guard_templates` comes first, also for the syntax check).

A rendering is also interruptible: inside :func:`interruptible` (a build), a rendering whose event
is set raises :class:`~eagle3_raw.errors.Interrupted` at its next loop step, call or output, so
Ctrl-C and SIGTERM stop a build even while a template renders in a worker thread.

Crossing a bound raises :class:`TemplateLimitError`, a Jinja ``SecurityError`` naming the bound:
the row is skipped with that reason, like any other template refusal. What is left: an operation
whose result size does not show in its operands (a ``str.format`` width computed inside the
template) can allocate once, up to that size, before it is refused.

transformers renders through ``chat_template_utils._compile_jinja_template`` (private, pinned with
transformers' major version); it is wrapped once so that the templates given to
:func:`guard_templates`, and only those, render from the bounded compilation.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import re
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment
from jinja2.visitor import NodeTransformer

from eagle3_raw.errors import Interrupted, RecipeError
from eagle3_raw.limits import PROMPT_CHARS, TEMPLATE_BYTES

if TYPE_CHECKING:
    from jinja2 import Template

LOOP_STEPS = 200_000
"""Loop iterations allowed in one rendering (a long conversation with tools takes thousands)."""
CALLS = 100_000
"""Calls (macros, methods, globals) allowed in one rendering (real templates make a few per message:
Qwen3's, Llama 3.1's and DeepSeek-V3's none to two for 900 messages)."""
CALL_DEPTH = 64
"""Calls nested in one another (a recursive macro over a tool's JSON schema nests a few)."""
BUILT_CHARS = 4 * PROMPT_CHARS
"""Characters of all the values one rendering builds (real templates build about three times what
they write: each message's text is trimmed, split, compared)."""
RENDER_SECONDS = 60.0
"""CPU seconds one rendering may take (a 2 MB prompt of 900 messages takes well under one)."""

_POWER_BITS = 1 << 20


class TemplateLimitError(SecurityError):
    """A chat template crossed one of the bounds of one rendering."""


@dataclass
class _Budget:
    output: int = 0
    steps: int = 0
    calls: int = 0
    depth: int = 0
    built: int = 0
    stop: threading.Event | None = None
    deadline: float = 0.0
    """The rendering thread's CPU time (``time.thread_time``) it must end by."""
    sizes: dict[int, tuple[Any, int]] = field(default_factory=dict)
    """Sizes of the containers seen, by id (each kept alive, so an id is never reused meanwhile)."""


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("eagle3_raw_template", default=None)
_STOP: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("e3_stop", default=None)
_GUARDED: dict[str, Template] = {}


@contextlib.contextmanager
def interruptible(stop: threading.Event) -> Iterator[None]:
    """Renderings started in this context (and in threads started from it with ``asyncio.to_thread``,
    which copies the context) raise :class:`~eagle3_raw.errors.Interrupted` once ``stop`` is set."""
    token = _STOP.set(stop)
    try:
        yield
    finally:
        _STOP.reset(token)


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


def compile_bounded(text: str) -> Template:
    """``text`` compiled within the bounds (and registered, as :func:`guard_templates` does);
    Jinja's TemplateSyntaxError for a template that does not compile."""
    guard_templates(text)
    return _GUARDED[text]


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
    """``text`` compiled in a bounded overlay of the environment transformers compiles it in (its
    optimizer off: nothing is evaluated while compiling)."""
    env: Any = _base_environment().overlay(optimized=False)
    env.intercepted_binops = frozenset({"*", "**", "%", "+"})
    env.call_binop = types.MethodType(_binop, env)
    env.call = types.MethodType(_call, env)
    env.concat = _concat
    env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
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

    def visit_List(self, node: nodes.List) -> nodes.Node:
        self.generic_visit(node)
        return _hook("e3_value", node)

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Node:
        self.generic_visit(node)
        if node.ctx != "load":
            return node  # an assignment target ({% set a, b = ... %}), not a value
        return _hook("e3_value", node)

    def visit_Dict(self, node: nodes.Dict) -> nodes.Node:
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
    token = _BUDGET.set(_Budget(stop=_STOP.get(), deadline=time.thread_time() + RENDER_SECONDS))
    try:
        return "".join(parts)
    except RecursionError as exc:  # nested deeper than Python allows before CALL_DEPTH: still a bound
        raise TemplateLimitError("the chat template nests its calls too deep") from exc
    finally:
        _BUDGET.reset(token)


def _check_stop(budget: _Budget) -> None:
    """Interrupted once the build stops; TemplateLimitError past the rendering's CPU time."""
    if budget.stop is not None and budget.stop.is_set():
        raise Interrupted("stopped while a chat template was rendering")
    if time.thread_time() > budget.deadline:
        spent = f"{RENDER_SECONDS:,.0f} s of CPU time"
        raise TemplateLimitError(f"the chat template rendered for more than {spent}")


def _out(value: Any) -> Any:
    budget = _BUDGET.get()
    if budget is not None:
        _check_stop(budget)
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
                _check_stop(budget)
                budget.steps += 1
                if budget.steps > LOOP_STEPS:
                    raise TemplateLimitError(f"the chat template looped more than {LOOP_STEPS:,} times")
            yield item


def _each(iterable: Any) -> _Counted:
    return _Counted(iterable)


# --- values ------------------------------------------------------------------------------------------


_CONTAINERS = (list, tuple, dict, set, frozenset)


def _size(value: Any) -> int:
    """Characters ``value`` stands for: a string's length; a container's items plus the sizes of
    the items, through every level (a container seen twice counts twice; each one's size is
    remembered for the rendering, so ``[x, x]`` costs two look-ups), stopping early above the
    limit; 16 for anything else."""
    if isinstance(value, str):
        return len(value)
    if not isinstance(value, _CONTAINERS):
        return 16
    budget = _BUDGET.get()
    sizes = budget.sizes if budget is not None else {}
    try:
        return _container_size(value, sizes)
    except RecursionError as exc:
        raise TemplateLimitError("the chat template met a value nested too deep") from exc


def _container_size(value: Any, sizes: dict[int, tuple[Any, int]]) -> int:
    known = sizes.get(id(value))
    if known is not None and known[0] is value:
        return known[1]
    items = [*value.keys(), *value.values()] if isinstance(value, Mapping) else value
    total = len(items)
    for item in items:
        if total > PROMPT_CHARS:
            break
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, _CONTAINERS):
            total += _container_size(item, sizes)
        else:
            total += 1
    sizes[id(value)] = (value, total)
    return total


def _checked(value: Any) -> Any:
    """``value``, once its size is within the limit, charged to what the rendering built."""
    size = _size(value)
    if size > PROMPT_CHARS:
        raise TemplateLimitError(f"the chat template built a value of more than {PROMPT_CHARS:,} characters")
    budget = _BUDGET.get()
    if budget is not None:
        budget.built += len(value) if isinstance(value, (str, *_CONTAINERS)) else 1
        if budget.built > BUILT_CHARS:
            raise TemplateLimitError(f"the chat template built more than {BUILT_CHARS:,} characters in all")
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
    budget = _BUDGET.get()
    if budget is None:
        return _checked(SandboxedEnvironment.call(env, context, obj, *args, **kwargs))
    _enter(budget)
    try:
        return _checked(SandboxedEnvironment.call(env, context, obj, *args, **kwargs))
    finally:
        budget.depth -= 1


def _enter(budget: _Budget) -> None:
    """One more call, one level deeper: refused past :data:`CALLS` or :data:`CALL_DEPTH`."""
    _check_stop(budget)
    budget.calls += 1
    if budget.calls > CALLS:
        raise TemplateLimitError(f"the chat template made more than {CALLS:,} calls")
    if budget.depth >= CALL_DEPTH:
        raise TemplateLimitError(f"the chat template nests calls more than {CALL_DEPTH} deep")
    budget.depth += 1


def _check_string_method(text: str, name: str, args: tuple[Any, ...]) -> None:
    if name in ("format", "format_map") and _wide(text):
        _refuse("formats a field too wide")
    if name == "replace" and len(args) >= 2:
        _check_replace(text, args[0], args[1])
    if name == "join" and args:
        _check_join(text, args[0])
    if name == "expandtabs" and args and _is_int(args[0]) and text.count("\t") * args[0] > PROMPT_CHARS:
        _refuse("expands tabs into a string too long")


def _check_replace(text: Any, old: Any, new: Any) -> None:
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        hits = text.count(old) if old else len(text) + 1
        if len(text) + hits * len(new) > PROMPT_CHARS:
            _refuse("replaces into a string too long")


def _check_join(separator: Any, items: Any) -> None:
    sized = isinstance(separator, str) and hasattr(items, "__len__")
    if sized and len(separator) * len(items) > PROMPT_CHARS:
        _refuse("joins with a separator into a string too long")


def _check_width(width: Any, lines: int) -> None:
    """A ``tojson``/``indent`` width (spaces, or a string) repeated on ``lines`` lines."""
    size = width if _is_int(width) else len(width) if isinstance(width, str) else 0
    if size * lines > PROMPT_CHARS:
        _refuse(f"indents {lines:,} lines by {size:,}")


def _json_indents(value: Any) -> int:
    """How many indentation widths ``json.dumps(value, indent=w)`` writes (each line's depth)."""
    total, stack = 0, [(value, 0)]
    while stack and total <= PROMPT_CHARS:
        item, depth = stack.pop()
        total += depth + 1
        if isinstance(item, Mapping):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((v, depth + 1) for v in item)
    return total


def _check_filter(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """The filters whose result size is a product of their arguments, checked before they run
    (``args`` start at the filtered value)."""
    value, rest = (args[0], args[1:]) if args else (None, ())
    if name == "tojson":
        indent = kwargs.get("indent", rest[1] if len(rest) > 1 else None)
        if indent:
            _check_width(indent, _json_indents(value))
    elif name == "indent":
        width = kwargs.get("width", rest[0] if rest else 4)
        lines = value.count("\n") + 1 if isinstance(value, str) else _size(value)
        _check_width(width, lines)
    elif name == "join":
        _check_join(kwargs.get("d", rest[0] if rest else ""), value)
    elif name == "replace" and len(rest) >= 2:
        _check_replace(value, rest[0], rest[1])


def _bounded_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with its size arguments checked before and its result after. The first
    positional argument (after the context or environment jinja passes some filters) is the
    filtered value, left alone: a large number may well be printed."""
    skip = 2 if hasattr(function, "jinja_pass_arg") else 1

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        if any(_is_int(a) and a > PROMPT_CHARS for a in (*args[skip:], *kwargs.values())):
            _refuse(f"passes a size too large to the {name} filter")
        _check_filter(name, args[skip - 1 :], kwargs)
        budget = _BUDGET.get()
        if budget is not None:
            _check_stop(budget)
        return _checked(function(*args, **kwargs))

    return bounded


_HOOKS = (_out, _each, _checked)


def _no_lipsum(*args: Any, **kwargs: Any) -> str:
    raise TemplateLimitError("the chat template calls lipsum(), which no chat template needs")


__all__ = [
    "BUILT_CHARS", "CALLS", "CALL_DEPTH", "LOOP_STEPS", "RENDER_SECONDS", "TemplateLimitError",
    "compile_bounded", "guard_templates", "interruptible",
]  # fmt: skip
