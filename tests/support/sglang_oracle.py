"""SGLang 0.5.23's own chat-path and parser code, loaded from its wheel as the oracle for the tests.

The wheel's members are extracted once by ``tests/reference/contract.py`` (cached under
``~/.cache/eagle3_raw/sglang-0.5.23/src``) and imported by file path under their real names, with
the real third-party packages they import (pydantic, fastapi, jinja2, transformers, jsonschema,
openai, partial_json_parser, msgspec, orjson). These modules run as shipped: ``protocol.py``,
``serving_base.py``, ``serving_chat.py``, ``serving_tokenize.py``, ``chat_encoding.py``,
``parallel_prompt_encode.py``,
``parser/jinja_template_utils.py``, ``parser/template_detection.py``, ``parser/reasoning_parser.py``,
``function_call/{function_call_parser,base_format_detector,core_types,utils,hermes_detector,
qwen25_detector}.py``.

What is stubbed, because it cannot load without torch or a running server:

- every other ``sglang.*`` module is an empty stand-in whose attributes are inert classes (the
  other parsers' detectors, ``io_struct``, observability, ``sglang.srt.utils``, ...); none of them
  is called on the paths the tests run (no multimodal data, no reasoning or tool-call parser
  configured for rendering, no Python chat encoder);
- ``sglang.srt.runtime_context``: ``get_serving()`` answers the server defaults (no
  ``--trust-request-chat-template``, no ``--allow-auto-truncate``, no default template kwargs),
  ``get_model()`` the context length; ``sglang.srt.environ.envs``: every variable unset (None);
- ``OpenAIServingChat.__init__`` is not run (it reaches the scheduler); :func:`chat_server` sets the
  attributes it would set for a text-only model with a Jinja template and no parsers, calling
  SGLang's own functions for the template features and the round-trip probe; the one line it
  restates is ``_tokenizer_auto_adds_specials = len(tokenizer.encode("")) > 0``.
"""

from __future__ import annotations

import asyncio
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from tests.reference import contract

REAL = (
    "sglang/srt/entrypoints/openai/protocol.py",
    "sglang/srt/entrypoints/openai/serving_base.py",
    "sglang/srt/entrypoints/openai/serving_chat.py",
    "sglang/srt/entrypoints/openai/serving_tokenize.py",
    "sglang/srt/entrypoints/openai/chat_encoding.py",
    "sglang/srt/entrypoints/openai/parallel_prompt_encode.py",
    "sglang/srt/parser/jinja_template_utils.py",
    "sglang/srt/parser/template_detection.py",
    "sglang/srt/parser/reasoning_parser.py",
    "sglang/srt/function_call/function_call_parser.py",
    "sglang/srt/function_call/base_format_detector.py",
    "sglang/srt/function_call/core_types.py",
    "sglang/srt/function_call/utils.py",
    "sglang/srt/function_call/hermes_detector.py",
    "sglang/srt/function_call/qwen25_detector.py",
)
_REAL_NAMES = {member[: -len(".py")].replace("/", ".") for member in REAL}


class _InertMeta(type):
    """Inert classes are also empty iterables and have any class attribute."""

    def __iter__(cls) -> Any:
        return iter(())

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert


class _Inert(metaclass=_InertMeta):
    """Stands in for anything a stubbed module exports: callable, subclassable, attribute-rich."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return _Inert()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Inert()


class _StubModule(ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (_Inert,), {})
        setattr(self, name, value)
        return value


class _Env:
    def get(self) -> None:
        return None


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Real files for :data:`REAL`, empty packages above them, stubs for the rest of ``sglang``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "sglang" and not fullname.startswith("sglang."):
            return None
        if fullname in _REAL_NAMES:
            file = self.root / (fullname.replace(".", "/") + ".py")
            return importlib.util.spec_from_file_location(fullname, file)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: ModuleType) -> None:
        if module.__name__ == "sglang.srt.runtime_context":
            module.get_serving = lambda: _SERVING  # type: ignore[attr-defined]
            module.get_model = lambda: _MODEL  # type: ignore[attr-defined]
        if module.__name__ == "sglang.srt.environ":
            module.envs = _Envs()  # type: ignore[attr-defined]


class _Envs:
    def __getattr__(self, name: str) -> _Env:
        return _Env()


_SERVING = SimpleNamespace(
    trust_request_chat_template=False, allow_auto_truncate=False, default_chat_template_kwargs=None,
    hf_chat_template_name=None, return_input_ids=False, return_output_ids=False, enable_cache_report=False,
)  # fmt: skip
_MODEL = SimpleNamespace(context_length=None, revision=None)


def load() -> SimpleNamespace:
    """The real modules (``protocol``, ``serving_chat``, ``serving_tokenize``, ...), loaded once."""
    root = contract.source_root(REAL)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(root))
    import importlib

    names = {
        "protocol": "sglang.srt.entrypoints.openai.protocol",
        "serving_chat": "sglang.srt.entrypoints.openai.serving_chat",
        "serving_tokenize": "sglang.srt.entrypoints.openai.serving_tokenize",
        "chat_encoding": "sglang.srt.entrypoints.openai.chat_encoding",
        "jinja_utils": "sglang.srt.parser.jinja_template_utils",
        "detection": "sglang.srt.parser.template_detection",
        "reasoning": "sglang.srt.parser.reasoning_parser",
        "function_call": "sglang.srt.function_call.function_call_parser",
    }
    return SimpleNamespace(**{key: importlib.import_module(name) for key, name in names.items()})


def chat_server(tokenizer: Any, *, model_type: str = "qwen3", architectures: Sequence[str] = ()) -> Any:
    """An ``OpenAIServingTokenize`` over ``tokenizer`` (its ``chat_template`` as the served template)."""
    sg = load()
    template = tokenizer.chat_template
    hf_config = SimpleNamespace(architectures=list(architectures), model_type=model_type)
    manager = SimpleNamespace(
        tokenizer=tokenizer, served_model_name="oracle",
        model_config=SimpleNamespace(is_multimodal=False, hf_config=hf_config, context_len=4096),
    )  # fmt: skip
    content_format = sg.jinja_utils.detect_jinja_template_content_format(template) if template else "string"
    templates = SimpleNamespace(
        chat_template_name=None, python_chat_template=None, jinja_template_content_format=content_format,
        jinja_template_may_reorder_tool_results=sg.jinja_utils.jinja_template_may_reorder_tool_results(template),
        reasoning_config=sg.detection.detect_reasoning_pattern(template)[1],
    )  # fmt: skip
    chat = object.__new__(sg.serving_chat.OpenAIServingChat)
    chat.__dict__.update(
        tokenizer_manager=manager, template_manager=templates, tool_call_parser=None, reasoning_parser=None,
        default_chat_template_kwargs={}, _reasoning_detector=None, is_gpt_oss=model_type == "gpt_oss",
        is_gemma4=False, is_minimax_m3=False, _encoding_adapter=None, _response_parser=None,
        _chat_template_cache=OrderedDict(),
    )  # fmt: skip
    chat.chat_encoding_spec = sg.chat_encoding.resolve_chat_encoding_spec(
        hf_config=hf_config, tokenizer=tokenizer, tool_call_parser=None
    )
    try:
        chat._tokenizer_auto_adds_specials = len(tokenizer.encode("")) > 0
    except Exception:
        chat._tokenizer_auto_adds_specials = True
    chat._prompt_text_round_trip_is_lossy = chat._probe_prompt_text_round_trip()
    chat._template_reads_reasoning_content = chat._chat_template_reads_reasoning_content()
    server = object.__new__(sg.serving_tokenize.OpenAIServingTokenize)
    server.tokenizer_manager = manager
    server.chat_serving = chat
    return server


def tokenize(server: Any, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of SGLang's ``/tokenize`` for ``body``, minus FastAPI's routing.

    A body its pydantic model refuses comes back as (400, ``{"validation": text}``).
    """
    import orjson
    import pydantic

    sg = load()
    try:
        request = sg.protocol.TokenizeRequest.model_validate(body)
    except pydantic.ValidationError as exc:
        return 400, {"validation": str(exc)}
    reply = asyncio.run(server._handle_non_streaming_request(request, request, None))
    if isinstance(reply, pydantic.BaseModel):
        return 200, reply.model_dump()
    return reply.status_code, orjson.loads(reply.body)
