"""The reference engine: determinism, SGLang finish semantics, chat-shaped and non-canonical outputs."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace
from typing import Any

import pytest

from eagle3_raw.reference.engine import EngineParams, ReferenceEngine
from eagle3_raw.reference.model_files import load_tokenizer
from eagle3_raw.resources import reference_model_dir

EOS, THINK, TOOL_CALL = 6139, 6140, 6142
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
GREEDY = EngineParams(max_new_tokens=4000, temperature=0.0)
Prompts = list[list[int]]


@pytest.fixture(scope="module")
def engine() -> ReferenceEngine:
    return ReferenceEngine()


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer()


def conversation(i: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "Be helpful."}, {"role": "user", "content": f"Question {i}: why?"}]


def prompt_ids(tok: Any, i: int, *, thinking: bool = True, tools: bool = False) -> list[int]:
    kwargs: dict[str, Any] = {"add_generation_prompt": True, "enable_thinking": thinking}
    ids: list[int] = tok.apply_chat_template(
        conversation(i), tools=TOOLS if tools else None, return_dict=False, **kwargs
    )
    return ids


@pytest.fixture(scope="module")
def prompts(tok: Any) -> Prompts:
    """60 prompts: thinking on, no tools."""
    return [prompt_ids(tok, i) for i in range(60)]


def test_loads_fast_and_describes_the_packaged_model(tok: Any) -> None:
    start = time.perf_counter()
    engine = ReferenceEngine()
    assert time.perf_counter() - start < 1.0
    assert engine.model_dir == reference_model_dir()
    assert (engine.vocab_size, engine.eos_token_id) == (len(tok), tok.eos_token_id)
    assert engine.context_length == 4096


def test_greedy_is_deterministic_and_ignores_the_seed(engine: ReferenceEngine, prompts: Prompts) -> None:
    runs = [(0.0, None), (0.0, 1), (0.0, 2), (1e-7, 3)]
    for ids in prompts[:10]:
        greedy = [EngineParams(max_new_tokens=4000, temperature=t, sampling_seed=s) for t, s in runs]
        top_k_one = EngineParams(max_new_tokens=4000, top_k=1, sampling_seed=5)
        assert len({tuple(engine.generate(ids, p).output_ids) for p in [*greedy, top_k_one]}) == 1


def test_sampling_depends_on_the_seed(engine: ReferenceEngine, prompts: Prompts) -> None:
    ids = prompts[0]

    def run(seed: int | None) -> tuple[int, ...]:
        return tuple(engine.generate(ids, EngineParams(max_new_tokens=500, sampling_seed=seed)).output_ids)

    assert run(7) == run(7)
    assert len({run(seed) for seed in range(8)}) >= 6
    assert len({run(None) for _ in range(4)}) >= 2


def test_stop_ends_with_eos(engine: ReferenceEngine, prompts: Prompts) -> None:
    for ids in prompts:
        out = engine.generate(ids, GREEDY)
        assert (out.finish, out.matched, out.output_ids[-1]) == ("stop", EOS, EOS)
        assert EOS not in out.output_ids[:-1]


def test_length_gives_exactly_max_new_tokens(engine: ReferenceEngine, prompts: Prompts) -> None:
    for ids in prompts[:20]:
        full = engine.generate(ids, GREEDY).output_ids
        for n in (1, 7, 64):
            out = engine.generate(ids, EngineParams(max_new_tokens=n, temperature=0.0))
            if n < len(full):
                assert (out.finish, out.matched, out.output_ids) == ("length", None, full[:n])
            else:
                assert (out.finish, out.output_ids) == ("stop", full)
    zero = engine.generate(prompts[0], EngineParams(max_new_tokens=0))
    assert (zero.output_ids, zero.finish, zero.matched) == ([], "length", None)


def test_eos_as_the_last_allowed_token_is_length(engine: ReferenceEngine, prompts: Prompts) -> None:
    full = engine.generate(prompts[0], GREEDY).output_ids
    out = engine.generate(prompts[0], EngineParams(max_new_tokens=len(full), temperature=0.0))
    assert (out.finish, out.matched, out.output_ids) == ("length", None, full)  # SGLang checks length first


def test_ignore_eos_always_runs_to_length(engine: ReferenceEngine, prompts: Prompts) -> None:
    eos_inside = 0
    for seed, ids in enumerate(prompts[:10]):
        params = EngineParams(3000, ignore_eos=True, stop_token_ids=frozenset({EOS}), sampling_seed=seed)
        out = engine.generate(ids, params)
        assert (len(out.output_ids), out.finish, out.matched) == (3000, "length", None)
        eos_inside += EOS in out.output_ids
    assert eos_inside > 0  # like SGLang, EOS is produced and ignored


def test_min_new_tokens_suppresses_eos(engine: ReferenceEngine, prompts: Prompts) -> None:
    for ids in prompts[:20]:
        natural = engine.generate(ids, GREEDY).output_ids
        min_new = len(natural) + 10
        out = engine.generate(ids, EngineParams(max_new_tokens=4000, min_new_tokens=min_new, temperature=0.0))
        assert out.output_ids[: len(natural) - 1] == natural[:-1]  # EOS dropped, the stream goes on
        assert EOS not in out.output_ids[:min_new]
        assert out.finish == "length" or (len(out.output_ids) > min_new and out.matched == EOS)


def test_stop_token_ids_cut_right_after_the_first_occurrence(
    engine: ReferenceEngine, prompts: Prompts
) -> None:
    for seed, ids in enumerate(prompts[:20]):
        base = EngineParams(max_new_tokens=4000, temperature=0.7, sampling_seed=seed)
        natural = engine.generate(ids, base).output_ids
        stop = natural[len(natural) // 2]
        params = EngineParams(4000, temperature=0.7, sampling_seed=seed, stop_token_ids=frozenset({stop}))
        out = engine.generate(ids, params)
        assert (out.output_ids, out.finish, out.matched) == (natural[: natural.index(stop) + 1], "stop", stop)


def test_stop_token_ids_wait_for_min_new_tokens(engine: ReferenceEngine, prompts: Prompts) -> None:
    for ids in prompts[:20]:
        natural = engine.generate(ids, GREEDY).output_ids
        stop = natural[len(natural) // 2]
        min_new = natural.index(stop) + 1
        params = EngineParams(4000, min_new_tokens=min_new, temperature=0.0, stop_token_ids=frozenset({stop}))
        out = engine.generate(ids, params)
        assert stop not in out.output_ids[:min_new]
        assert out.output_ids[-1] == out.matched and out.matched in (stop, EOS)
        assert len(out.output_ids) > min_new


def test_ids_are_in_vocabulary_and_decode(engine: ReferenceEngine, tok: Any, prompts: Prompts) -> None:
    for seed, ids in enumerate(prompts):
        out = engine.generate(ids, EngineParams(max_new_tokens=4000, sampling_seed=seed, temperature=1.3))
        assert all(0 <= i < engine.vocab_size for i in out.output_ids)
        assert "\ufffd" not in tok.decode(out.output_ids)


def test_thinking_follows_the_prompt(engine: ReferenceEngine, tok: Any) -> None:
    disabled = [engine.generate(prompt_ids(tok, i, thinking=False), GREEDY).output_ids for i in range(40)]
    assert all(THINK not in out for out in disabled)
    enabled = [engine.generate(prompt_ids(tok, i), GREEDY).output_ids for i in range(40)]
    thinking = [tok.decode(out) for out in enabled if THINK in out]
    assert 10 <= len(thinking) < 40
    assert all(text.startswith("<think>\n") and text.count("\n</think>\n\n") == 1 for text in thinking)


def test_a_prompt_that_opens_thinking_gets_its_close(engine: ReferenceEngine, tok: Any) -> None:
    for i in range(10):
        out = engine.generate(prompt_ids(tok, i) + tok.encode("<think>\n"), GREEDY).output_ids
        assert THINK not in out and tok.decode(out).count("\n</think>\n\n") == 1


def tool_calls(text: str) -> list[Any]:
    return [json.loads(block.split("\n</tool_call>")[0]) for block in text.split("<tool_call>\n")[1:]]


def test_tool_calls_are_json_and_likelier_with_tools(engine: ReferenceEngine, tok: Any) -> None:
    with_tools = [engine.generate(prompt_ids(tok, i, tools=True), GREEDY).output_ids for i in range(60)]
    without = [engine.generate(prompt_ids(tok, i), GREEDY).output_ids for i in range(60)]
    rate_with = sum(TOOL_CALL in out for out in with_tools) / 60
    assert rate_with > 0.25 and rate_with > sum(TOOL_CALL in out for out in without) / 60 + 0.2
    for out in with_tools:
        for call in tool_calls(tok.decode(out)):
            assert isinstance(call["name"], str) and isinstance(call["arguments"], dict)


def as_message(text: str, thinking: bool) -> dict[str, Any]:
    """The assistant message an OpenAI-style parser would make of an output's text."""
    message: dict[str, Any] = {"role": "assistant", "reasoning_content": None if thinking else ""}
    if text.startswith("<think>\n"):
        message["reasoning_content"], text = text[len("<think>\n") :].split("\n</think>\n\n", 1)
    content, *calls = text.split("<tool_call>\n")
    message["content"] = content.removesuffix("\n") if calls else content
    message["tool_calls"] = [{"function": call} for call in tool_calls(text)]
    return message


def render(tok: Any, messages: list[dict[str, Any]], tools: bool, **kwargs: Any) -> str:
    text: str = tok.apply_chat_template(messages, tools=TOOLS if tools else None, tokenize=False, **kwargs)
    return text


@pytest.mark.parametrize("thinking", [True, False])
def test_outputs_render_back_through_the_template(engine: ReferenceEngine, tok: Any, thinking: bool) -> None:
    """Parsed into an assistant message and rendered again, an output gives back prompt + output."""
    for i in range(30):
        tools = i % 2 == 0
        output = engine.generate(prompt_ids(tok, i, thinking=thinking, tools=tools), GREEDY)
        text = tok.decode(output.output_ids)
        prompt = render(tok, conversation(i), tools, add_generation_prompt=True, enable_thinking=thinking)
        message = as_message(text.removesuffix("<|im_end|>"), thinking)
        assert render(tok, [*conversation(i), message], tools) == prompt + text + "\n"


def test_non_canonical_splits_are_common(engine: ReferenceEngine, tok: Any, prompts: Prompts) -> None:
    outputs = [engine.generate(ids, GREEDY).output_ids for ids in prompts]
    non_canonical = sum(tok.encode(tok.decode(out)) != out for out in outputs)
    assert non_canonical > 0.5 * len(outputs)


def test_lengths_are_long_tailed(engine: ReferenceEngine, tok: Any) -> None:
    lengths = sorted(len(engine.generate([6138, i, 6139, 6138], GREEDY).output_ids) for i in range(400))
    median = statistics.median(lengths)
    assert 20 < median < 300
    assert lengths[int(0.9 * len(lengths))] > 2 * median
    assert lengths[-1] > 5 * median


def test_penalties_change_the_output(engine: ReferenceEngine, prompts: Prompts) -> None:
    plain = EngineParams(max_new_tokens=2000, temperature=0.0, ignore_eos=True)
    penalized = replace(plain, frequency_penalty=1.0, repetition_penalty=1.5)
    changed = sum(engine.generate(ids, plain) != engine.generate(ids, penalized) for ids in prompts[:10])
    assert changed >= 5
