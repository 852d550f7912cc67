"""One battery of requests for the reference server and the real SGLang, and the shape of a reply.

Each :class:`Case` is sent to both servers (same model folder, same flags where the reference
server has them). A reply is compared by its :func:`shape`: the status, the kind of body (JSON,
an SSE stream, text) and, for JSON, every field with the type of its value (nested objects field
by field, lists by their items); for the cases the project reads the message of, the message's
field too (:func:`error_shape`). Values are compared where both servers must agree on them
(``same``: e.g. the output ids of a greedy generation, which the reference model class makes the
real server produce).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from eagle3_raw.sglang.client import SERVER_INFO_KEYS
from eagle3_raw.statuses import error_message as error_text

CHAT = [{"role": "user", "content": "What is the weather in Oslo?"}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather for a city", "parameters": CITY},
    }
]
# A short ChatML prompt in the reference tokenizer's ids (the tests encode it).
PROMPT_TEXT = "<|im_start|>user\nWhat is the weather in Oslo?<|im_end|>\n<|im_start|>assistant\n"
ALL_SAMPLING = {  # every sampling key a recipe can set that the project sends as SGLang names it
    "max_new_tokens": 12, "min_new_tokens": 2, "temperature": 0.0, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
    "frequency_penalty": 0.1, "presence_penalty": 0.1, "repetition_penalty": 1.05, "stop": ["\n\n"],
    "stop_token_ids": [6143], "ignore_eos": False, "skip_special_tokens": False,
    "spaces_between_special_tokens": True, "no_stop_trim": False, "sampling_seed": 1234,
}  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One request: ``body`` may name ``$PROMPT`` (the prompt's ids) or ``$LONG`` (over the context)."""

    name: str
    path: str
    body: Any = None
    method: str = "POST"
    same: tuple[str, ...] = ()  # dotted paths whose values must be equal on both servers
    reads_message: bool = False  # the project reads this error's message: its field must match
    fields: tuple[str, ...] = ()  # compare only these top-level fields (the ones the project reads)
    state_fields: tuple[str, ...] = ()  # and these of each ``internal_states`` entry
    content_type: str = "application/json"


def _generate(name: str, sampling: dict[str, Any], *, same: tuple[str, ...] = (), **extra: Any) -> Case:
    body = {"rid": f"battery-{name}", "input_ids": "$PROMPT", "sampling_params": sampling, **extra}
    return Case(name, "/generate", body, same=same)


GREEDY = {"max_new_tokens": 16, "temperature": 0.0}
CASES: tuple[Case, ...] = (
    # what the project sends: rid, input_ids, sampling_params
    _generate(
        "greedy",
        GREEDY,
        same=(
            "output_ids",
            "text",
            "meta_info.finish_reason",
            "meta_info.prompt_tokens",
            "meta_info.completion_tokens",
        ),
    ),
    _generate("every-sampling-key", ALL_SAMPLING),
    _generate("sampled", {"max_new_tokens": 8, "temperature": 0.8, "sampling_seed": 7}),
    _generate(
        "stop-at-eos",
        {"max_new_tokens": 2000, "temperature": 0.0},
        same=("output_ids", "meta_info.finish_reason"),
    ),
    _generate("zero-new-tokens", {"max_new_tokens": 0, "temperature": 0.0}),
    _generate("streamed", GREEDY, stream=True),
    Case(
        "batch",
        "/generate",
        {"input_ids": ["$PROMPT", "$PROMPT"], "sampling_params": GREEDY},
        same=("[].output_ids",),
    ),
    # refused requests
    _generate("unknown-sampling-key", {"max_new_tokens": 4, "no_such_key": 1}),
    _generate("negative-max-new-tokens", {"max_new_tokens": -1}),
    _generate("temperature-negative", {"max_new_tokens": 4, "temperature": -1.0}),
    Case("id-out-of-vocabulary", "/generate", {"input_ids": [1, 2, 999999], "sampling_params": GREEDY}),
    Case("negative-id", "/generate", {"input_ids": [1, -5, 3], "sampling_params": GREEDY}),
    Case("string-ids", "/generate", {"input_ids": ["a", "b"], "sampling_params": GREEDY}),
    Case("empty-ids", "/generate", {"input_ids": [], "sampling_params": GREEDY}),
    Case(
        "over-long-prompt", "/generate", {"input_ids": "$LONG", "sampling_params": GREEDY}, reads_message=True
    ),
    _generate("prompt-plus-output-over-context", {"max_new_tokens": 5000, "temperature": 0.0}),
    Case("no-input", "/generate", {"sampling_params": GREEDY}),
    Case("not-json", "/generate", "$RAW:{not json"),
    # the chat path and the side endpoints
    Case("tokenize-prompt", "/tokenize", {"prompt": "Hello there, world"}, same=("tokens", "count")),
    Case(
        "tokenize-messages",
        "/tokenize",
        {"messages": CHAT, "add_generation_prompt": True},
        same=("tokens", "count"),
    ),
    Case(
        "tokenize-tools-no-thinking",
        "/tokenize",
        {
            "messages": CHAT,
            "tools": TOOLS,
            "add_generation_prompt": True,
            "chat_template_kwargs": {"enable_thinking": False},
        },
        same=("count",),
    ),
    Case("tokenize-bad-role", "/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}),
    Case("detokenize", "/detokenize", {"tokens": [40, 824, 328, 414]}, same=("text",)),
    Case(
        "separate-reasoning",
        "/separate_reasoning",
        {"text": "<think>\nhm\n</think>\n\nSure.", "reasoning_parser": "qwen3"},
        same=("reasoning_text", "text"),
    ),
    Case(
        "parse-function-call",
        "/parse_function_call",
        {
            "text": 'Ok.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
            "tool_call_parser": "qwen25",
            "tools": TOOLS,
        },
        same=("normal_text", "calls"),
    ),
    # a JSON body sent as bytes of no declared type (what a bare HTTP client sends)
    *(
        Case(f"{path.strip('/')}-as-octet-stream", path, body, content_type="application/octet-stream")
        for path, body in (
            ("/generate", {"input_ids": "$PROMPT", "sampling_params": GREEDY}),
            ("/tokenize", {"prompt": "Hello"}),
            ("/separate_reasoning", {"text": "<think>a</think>b", "reasoning_parser": "qwen3"}),
        )
    ),
    Case("abort-unknown-rid", "/abort_request", {"rid": "no-such-request", "abort_all": False}),
    # the info endpoints
    Case("health", "/health", method="GET"),
    Case(
        "model-info",
        "/model_info",
        method="GET",
        same=(
            "model_path",
            "tokenizer_path",
            "is_generation",
            "reasoning_parser",
            "tool_call_parser",
            "weight_version",
            "preferred_sampling_params",
            "architectures",
        ),
    ),
    Case(
        "server-info",
        "/server_info",
        method="GET",
        fields=(*SERVER_INFO_KEYS, "internal_states"),
        state_fields=(
            "effective_max_running_requests_per_dp",
            "speculative_algorithm",
            "speculative_eagle_topk",
            "speculative_num_steps",
            "speculative_num_draft_tokens",
        ),
        same=(
            "version",
            "model_path",
            "served_model_name",
            "tp_size",
            "dp_size",
            "max_req_input_len",
            "reasoning_parser",
            "tool_call_parser",
            "enable_deterministic_inference",
            "skip_tokenizer_init",
        ),
    ),
    Case("v1-models", "/v1/models", method="GET", same=("data.[].max_model_len",)),
    Case("no-such-route", "/no_such_route", method="GET"),
)


# What the real SGLang answers and the reference server does not, with the reason (the README lists them).
DIVERGENCES: dict[str, dict[str, str]] = {
    "model-info": {
        "embedding": "SGLang's description of embedding support (families, pooling, cache switches): the "
        "reference server generates only, and eagle3_raw reads none of it",
    },
}


def without_divergences(answer: Answer, case: Case) -> Answer:
    """``answer`` less the fields :data:`DIVERGENCES` lists for ``case``."""
    listed = DIVERGENCES.get(case.name, {})
    if not listed or not isinstance(answer.body, dict):
        return answer
    return Answer(answer.status, answer.kind, {k: v for k, v in answer.body.items() if k not in listed})


@dataclass(frozen=True)
class Answer:
    status: int
    kind: str  # "json", "sse" or "text"
    body: Any  # the parsed JSON, the list of SSE payloads, or the text


def send(url: str, case: Case, prompt: list[int], context_length: int) -> Answer:
    raw = _body(case.body, prompt, context_length)
    headers = {"Content-Type": case.content_type} if raw is not None else {}
    request = urllib.request.Request(url + case.path, data=raw, method=case.method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=300) as reply:
            return _answer(reply.status, reply.headers.get("Content-Type", ""), reply.read())
    except urllib.error.HTTPError as error:
        return _answer(error.code, error.headers.get("Content-Type", ""), error.read())
    except (TimeoutError, ConnectionError) as error:  # the shape says so
        return Answer(-1, "text", repr(error))


def _body(body: Any, prompt: list[int], context_length: int) -> bytes | None:
    if body is None:
        return None
    if isinstance(body, str) and body.startswith("$RAW:"):
        return body[len("$RAW:") :].encode()
    text = json.dumps(body).replace('"$PROMPT"', json.dumps(prompt))
    return text.replace(
        '"$LONG"', json.dumps((prompt * (context_length // len(prompt) + 2))[: context_length + 8])
    ).encode()


def _answer(status: int, content_type: str, payload: bytes) -> Answer:
    if content_type.startswith("text/event-stream"):
        events = [line[len(b"data: ") :] for line in payload.split(b"\n") if line.startswith(b"data: ")]
        return Answer(status, "sse", [e.decode() if e == b"[DONE]" else json.loads(e) for e in events])
    try:
        return Answer(status, "json", json.loads(payload))
    except ValueError:
        return Answer(status, "text", payload.decode(errors="replace"))


def skeleton(value: Any) -> Any:
    """The fields and value types of a JSON value (a list: the union of its items' skeletons)."""
    if isinstance(value, dict):
        return {key: skeleton(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        items = [skeleton(item) for item in value]
        unique = [item for i, item in enumerate(items) if item not in items[:i]]
        return ["list", *unique]
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"  # JSON has one number type; 1 and 1.0 are both numbers
    return "null" if value is None else type(value).__name__


def shape(answer: Answer, case: Case) -> dict[str, Any]:
    """What two servers must share for a case: status, kind of body, fields and types (of the
    case's ``fields`` only, where it names them)."""
    body = answer.body
    if case.fields and isinstance(body, dict):
        body = {key: body[key] for key in case.fields if key in body}
        if case.state_fields and isinstance(body.get("internal_states"), list):
            body["internal_states"] = [{k: state[k] for k in case.state_fields if k in state}
                                       for state in body["internal_states"]]  # fmt: skip
    if answer.kind == "sse":
        body = [event for event in body if event != "[DONE]"] + (["[DONE]"] if "[DONE]" in body else [])
        return {
            "status": answer.status,
            "kind": "sse",
            "events": skeleton(body),
            "done": "[DONE]" in answer.body,
        }
    return {
        "status": answer.status,
        "kind": answer.kind,
        "body": skeleton(body) if answer.kind == "json" else "text",
    }


def error_shape(answer: Answer) -> str:
    """Where :func:`eagle3_raw.statuses.error_message` finds the message in an error body."""
    body = answer.body
    if answer.kind != "json" or not isinstance(body, dict):
        return answer.kind
    error = body.get("error", body.get("message"))
    key = "error" if "error" in body else "message"
    return f"{key}.message" if isinstance(error, dict) else key


def error_message(answer: Answer) -> str:
    """The message eagle3_raw takes from an error body (:func:`eagle3_raw.statuses.error_message`)."""
    return error_text(
        json.dumps(answer.body).encode() if answer.kind == "json" else str(answer.body).encode()
    )


def value(body: Any, path: str) -> Any:
    """The value at a dotted ``path`` (``[]`` maps over a list)."""
    if not path:
        return body
    head, _, rest = path.partition(".")
    if head == "[]":
        return [value(item, rest) for item in body]
    return value(body.get(head) if isinstance(body, dict) else None, rest)
