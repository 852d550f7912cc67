"""Write the demo recipe's prompt files into builder_scripts/prompts/ (deterministic, no randomness).

    python scripts/make_demo_prompts.py [--out builder_scripts/prompts]

- ``sharegpt.jsonl``: 40 ShareGPT chats (``conversations`` of ``{from, value}``), single- and
  multi-turn, some with a row-level ``system``, some ending with a ``gpt`` turn.
- ``openai.jsonl``: 40 OpenAI-messages rows: ``tools`` with assistant ``tool_calls`` (arguments as
  JSON strings and as objects) and ``tool`` results, assistant ``reasoning_content``, text parts.
- ``plain.jsonl``: 40 plain ``prompt`` strings, some with a ``system``.

Every row has an ``id``. The files are small so the demo runs quickly on the CPU reference server.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROWS_PER_FILE = 40

TOPICS = [
    ("the water cycle", "water evaporates, condenses into clouds and falls as rain"),
    ("photosynthesis", "plants turn light, water and carbon dioxide into sugar and oxygen"),
    ("binary search", "it halves a sorted range until the target is found"),
    ("the French Revolution", "it began in 1789 and ended the absolute monarchy"),
    ("compound interest", "interest is earned on earlier interest as well as on the principal"),
    ("plate tectonics", "the crust is split into plates that drift on the mantle"),
    ("hash tables", "keys are hashed to buckets for near constant-time lookups"),
    ("the moon's phases", "we see different parts of its sunlit half as it orbits"),
    ("vaccines", "they train the immune system with a harmless version of a pathogen"),
    ("recursion", "a function solves a problem by calling itself on smaller inputs"),
]
ASKS = [
    "Explain {topic} in two sentences.",
    "What is {topic}? Keep it short.",
    "Give me a simple analogy for {topic}.",
    "Why does {topic} matter?",
]
PLAIN_ASKS = [
    "Write a haiku about {topic}.",
    "List three facts about {topic}.",
    "Describe {topic} to a ten-year-old.",
    "Write one quiz question about {topic}, with the answer.",
]
FOLLOW_UPS = ["Can you give an example?", "Summarize that in one line.", "What is a common misconception?"]
SYSTEMS = ["You are a concise tutor.", "Answer like a friendly teacher.", "Be precise and brief."]

TOOLS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
    "convert_currency": {
        "description": "Convert an amount between currencies.",
        "parameters": {
            "type": "object",
            "properties": {
                "amount": {"type": "number"},
                "from": {"type": "string"},
                "to": {"type": "string"},
            },
            "required": ["amount", "from", "to"],
        },
    },
    "search_books": {
        "description": "Search a library catalogue.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
CITIES = ["Oslo", "Lima", "Nairobi", "Osaka", "Porto", "Denver", "Hanoi", "Tunis"]
CURRENCIES = [("USD", "EUR"), ("GBP", "JPY"), ("EUR", "CHF"), ("AUD", "CAD")]
BOOK_QUERIES = ["sailing for beginners", "history of tea", "modern astronomy", "bread baking"]


def tool_def(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, **TOOLS[name]}}


def call(name: str, arguments: dict[str, Any], call_id: str, as_string: bool) -> dict[str, Any]:
    args: Any = json.dumps(arguments) if as_string else arguments
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


# --- ShareGPT --------------------------------------------------------------------------------


def sharegpt_row(i: int) -> dict[str, Any]:
    topic, fact = TOPICS[i % len(TOPICS)]
    ask = ASKS[(i // len(TOPICS)) % len(ASKS)].format(topic=topic)
    turns = [{"from": "human", "value": ask}]
    if i % 4 in (1, 3):
        turns += [{"from": "gpt", "value": f"In short, {fact}."}]
        turns += [{"from": "human", "value": FOLLOW_UPS[i % len(FOLLOW_UPS)]}]
    if i % 4 == 3:
        turns += [{"from": "gpt", "value": f"For example: {fact}, step by step."}]
    row: dict[str, Any] = {"id": f"sharegpt-{i:03d}", "conversations": turns}
    if i % 5 == 0:
        row["system"] = SYSTEMS[i % len(SYSTEMS)]
    return row


# --- OpenAI messages -------------------------------------------------------------------------


def weather_chat(i: int) -> dict[str, Any]:
    city = CITIES[i % len(CITIES)]
    weather = call("get_weather", {"city": city, "unit": "C"}, f"call_w{i}", as_string=i % 2 == 0)
    result = json.dumps({"temp": i % 30, "sky": "clear"})
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You can call tools. Use them when they help."},
        {"role": "user", "content": f"What's the weather like in {city} right now?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": f"The user wants the current weather in {city}; I should call get_weather.",
            "tool_calls": [weather],
        },
        {"role": "tool", "tool_call_id": f"call_w{i}", "content": result},
    ]
    if i % 3 == 0:
        messages.append({"role": "assistant", "content": f"It is {i % 30} degrees and clear in {city}."})
    return {"tools": [tool_def("get_weather"), tool_def("convert_currency")], "messages": messages}


def currency_chat(i: int) -> dict[str, Any]:
    source, target = CURRENCIES[i % len(CURRENCIES)]
    amount = 10 * (i + 1)
    return {
        "tools": [tool_def("convert_currency")],
        "messages": [
            {"role": "user", "content": f"How much is {amount} {source} in {target}?"},
            {
                "role": "assistant",
                "content": "Let me convert that.",
                "tool_calls": [call("convert_currency", {"amount": amount, "from": source, "to": target},
                                    f"call_c{i}", as_string=i % 2 == 1)],
            },
            {"role": "tool", "tool_call_id": f"call_c{i}", "content": json.dumps({"result": amount * 0.9})},
        ],
    }  # fmt: skip


def books_chat(i: int) -> dict[str, Any]:
    query = BOOK_QUERIES[i % len(BOOK_QUERIES)]
    return {
        "tools": [tool_def("search_books"), tool_def("get_weather")],
        "messages": [{"role": "user", "content": f"Find me {i // 5 + 1} books about {query}."}],
    }


def reasoning_chat(i: int) -> dict[str, Any]:
    a, b = i + 3, 2 * i + 5
    return {
        "messages": [
            {"role": "system", "content": "Think step by step before answering."},
            {"role": "user", "content": f"What is {a} times {b}?"},
            {
                "role": "assistant",
                "reasoning_content": f"{a} times {b}: {a} * {b} = {a * b}.",
                "content": f"{a} times {b} is {a * b}.",
            },
            {"role": "user", "content": f"And {a * b} plus {a}?"},
        ]
    }


def parts_chat(i: int) -> dict[str, Any]:
    topic, _ = TOPICS[(i // 5) % len(TOPICS)]
    return {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"Here is a topic: {topic}."},
                    {"type": "text", "text": "Write a short quiz question about it."},
                ],
            }
        ]
    }


OPENAI_KINDS: list[Callable[[int], dict[str, Any]]] = [
    weather_chat, currency_chat, books_chat, reasoning_chat, parts_chat,
]  # fmt: skip


def openai_row(i: int) -> dict[str, Any]:
    return {"id": f"openai-{i:03d}", **OPENAI_KINDS[i % len(OPENAI_KINDS)](i)}


# --- plain prompts ---------------------------------------------------------------------------


def plain_row(i: int) -> dict[str, Any]:
    topic, _ = TOPICS[i % len(TOPICS)]
    row: dict[str, Any] = {"id": f"plain-{i:03d}", "prompt": PLAIN_ASKS[(i // 10) % 4].format(topic=topic)}
    if i % 4 == 2:
        row["system"] = SYSTEMS[i % len(SYSTEMS)]
    return row


FILES: dict[str, Callable[[int], dict[str, Any]]] = {
    "sharegpt.jsonl": sharegpt_row,
    "openai.jsonl": openai_row,
    "plain.jsonl": plain_row,
}


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, make in FILES.items():
        lines = [json.dumps(make(i), ensure_ascii=False) for i in range(ROWS_PER_FILE)]
        (out / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parent.parent / "builder_scripts" / "prompts"
    parser.add_argument("--out", type=Path, default=default)
    write(parser.parse_args().out)


if __name__ == "__main__":
    main()
