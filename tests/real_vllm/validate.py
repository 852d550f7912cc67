"""Run by :func:`tests.real_vllm.contract.validate` with the vLLM venv's python and vLLM 0.33.0 first
on ``sys.path``: reads ``[[model name, body], ...]`` on stdin, prints one JSON list of verdicts
(null: the model takes the body; else pydantic's error, or the body's keys the model lacks).

Not a test module (not named ``test_*``); imports only what the stdin names.
"""

from __future__ import annotations

import json
import sys
from typing import Any

MODULES = {
    "CompletionRequest": "vllm.entrypoints.openai.completion.protocol",
    "CompletionResponse": "vllm.entrypoints.openai.completion.protocol",
    "ChatCompletionRequest": "vllm.entrypoints.openai.chat_completion.protocol",
    "ChatCompletionResponse": "vllm.entrypoints.openai.chat_completion.protocol",
    "TokenizeCompletionRequest": "vllm.entrypoints.serve.tokenize.protocol",
    "TokenizeChatRequest": "vllm.entrypoints.serve.tokenize.protocol",
    "TokenizeResponse": "vllm.entrypoints.serve.tokenize.protocol",
    "DetokenizeRequest": "vllm.entrypoints.serve.tokenize.protocol",
    "DetokenizeResponse": "vllm.entrypoints.serve.tokenize.protocol",
    "ModelList": "vllm.entrypoints.serve.engine.protocol",
    "ErrorResponse": "vllm.entrypoints.serve.engine.protocol",
    "GenerateRequest": "vllm.entrypoints.scale_out.token_in_token_out.protocol",
    "GenerateTokensResponse": "vllm.entrypoints.scale_out.token_in_token_out.protocol",
    "DerenderChatRequest": "vllm.entrypoints.scale_out.token_in_token_out.protocol",
}


def _model(name: str) -> Any:
    module = __import__(MODULES[name], fromlist=[name])
    return getattr(module, name)


def _unknown_keys(model: Any, body: Any, where: str = "") -> list[str]:
    """Keys of ``body`` the pydantic ``model`` has no field for, down through nested models."""
    if not isinstance(body, dict) or not hasattr(model, "model_fields"):
        return []
    unknown = [f"{where}{key}" for key in body if key not in model.model_fields]
    for key, field in model.model_fields.items():
        value = body.get(key)
        for inner in _models_in(field.annotation):
            items = value if isinstance(value, list) else [value]
            for item in items:
                if isinstance(item, dict):
                    unknown += _unknown_keys(inner, item, f"{where}{key}.")
    return sorted(set(unknown))


def _models_in(annotation: Any) -> list[Any]:
    import typing

    if hasattr(annotation, "model_fields"):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def verdict(name: str, body: Any, is_response: bool) -> str | None:
    import pydantic

    model = _model(name)
    try:
        model.model_validate(body)
    except pydantic.ValidationError as exc:
        return str(exc)
    unknown = _unknown_keys(model, body) if is_response else []
    return f"keys {name} does not have: {unknown}" if unknown else None


def main() -> None:
    checks = json.loads(sys.stdin.read())
    out = [verdict(name, body, not name.endswith("Request")) for name, body in checks]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
