"""What a recipe may ask of each engine: its own parser names; a vLLM server takes no key of
SGLang's it has no equivalent for, and renders no ``reasoning_effort`` (its ``/tokenize`` would
ignore it while a local rendering would not). Checked when the recipe names its engine
(``server.engine``, or a launched one) and again once the run knows the engine of the servers it
asked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from eagle3_raw.errors import RecipeError
from eagle3_raw.sglang import parsers as sglang_parsers
from eagle3_raw.vllm import parsers as vllm_parsers
from eagle3_raw.vllm.sampling import unsupported_keys

if TYPE_CHECKING:
    from eagle3_raw.recipe.schema import Recipe


PARSERS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "sglang": (sglang_parsers.REASONING_PARSER_NAMES, sglang_parsers.TOOL_CALL_PARSER_NAMES),
    "vllm": (vllm_parsers.REASONING_PARSER_NAMES, vllm_parsers.TOOL_CALL_PARSER_NAMES),
}
"""Each engine's reasoning and tool-call parser names."""


def check_for_engine(recipe: Recipe, engine: str) -> None:
    """RecipeError naming the field a server of ``engine`` cannot honour."""
    _check_parsers(recipe, engine)
    if engine != "vllm":
        return
    sections = [("sampling.", recipe.sampling.params)]
    sections += [(f"sampling.mixture[{i}].", c.params) for i, c in enumerate(recipe.sampling.mixture)]
    for prefix, params in sections:
        for key, why in unsupported_keys(params).items():
            raise RecipeError(f"{prefix}{key}", params[key], f"not for a vLLM server: {why}")
    efforts = [("model.reasoning_effort", recipe.model.reasoning_effort)]
    efforts += [(f"sampling.mixture[{i}].reasoning_effort", c.reasoning_effort)
                for i, c in enumerate(recipe.sampling.mixture)]  # fmt: skip
    for where, effort in efforts:
        if effort is not None:
            raise RecipeError(
                where, effort,
                "not for a vLLM server: its /tokenize renders without it; put the template's keyword in "
                "model.chat_template_kwargs (e.g. reasoning_effort: high for gpt-oss)",
            )  # fmt: skip


def _check_parsers(recipe: Recipe, engine: str) -> None:
    reasoning, tools = PARSERS[engine]
    label = {"sglang": "SGLang", "vllm": "vLLM"}[engine]
    for field, name, known in (
        ("rollout.reasoning_parser", recipe.rollout.reasoning_parser, reasoning),
        ("rollout.tool_call_parser", recipe.rollout.tool_call_parser, tools),
    ):  # fmt: skip
        if name is not None and name not in known:
            raise RecipeError(
                field, name, f"not a {label} parser (the servers are {label}); known: {', '.join(known)}"
            )
