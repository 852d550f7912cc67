"""``/generate`` against ``shared/sglang-protocol.md`` §1-§4 and §9, one test per behaviour.

Every exchange goes through :class:`~tests.reference.conformance.Conformance`: each request body is
judged by SGLang's own ``GenerateRequest`` contract and each response decoded with its
``GenerateResponse`` (the ``sglang`` fixture).
"""

from __future__ import annotations

from typing import Any

import pytest

from eagle3_raw.reference.model_files import load_raw_tokenizer
from tests.reference.conformance import Conformance
from tests.reference.wire import request

EOS = 6139
TOKENIZER = load_raw_tokenizer()
META_KEYS = [
    "id",
    "finish_reason",
    "prompt_tokens",
    "weight_version",
    "num_retractions",
    "reasoning_tokens",
    "completion_tokens",
    "cached_tokens",
    "weight_versions",
    "cached_tokens_details",
    "dp_rank",
    "e2e_latency",
    "response_sent_to_client_ts",
]  # fmt: skip  (the real SGLang's order: tests/real_sglang/test_conformance.py)
TIMING_KEYS = ("e2e_latency", "response_sent_to_client_ts", "id")


def chat(question: str) -> list[int]:
    """A ChatML prompt, as eagle3_raw renders one."""
    text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    ids: list[int] = TOKENIZER.encode(text).ids
    return ids


def decode(ids: list[int], skip_special_tokens: bool = True) -> str:
    text: str = TOKENIZER.decode(ids, skip_special_tokens=skip_special_tokens)
    return text


GREEDY = {"temperature": 0, "max_new_tokens": 1024}
PROMPT = chat("What is a river?")


def greedy(sglang: Conformance, prompt: list[int] = PROMPT, **sampling: Any) -> dict[str, Any]:
    result: dict[str, Any] = sglang.ok({"input_ids": prompt, "sampling_params": {**GREEDY, **sampling}})
    return result


def without_timing(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["meta_info"].items() if k not in TIMING_KEYS}
    return {**obj, "meta_info": meta}


# --- §3 non-streaming responses --------------------------------------------------------------


def test_single_prompt_returns_one_object_with_sglangs_meta_info_keys(sglang: Conformance) -> None:
    result = sglang.ok(
        {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 16}}
    )
    assert isinstance(result, dict) and list(result) == ["text", "output_ids", "meta_info"]
    meta = result["meta_info"]
    assert list(meta) == META_KEYS
    assert (
        meta["weight_version"] == "default" and meta["num_retractions"] == 0 and meta["reasoning_tokens"] == 0
    )
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": meta["completion_tokens"]}]
    assert meta["e2e_latency"] > 0 and meta["prompt_tokens"] == len(
        TOKENIZER.encode("The capital of France is").ids
    )


def test_response_content_type_is_json(sglang: Conformance) -> None:
    reply = sglang.generate({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4}})
    assert reply.status == 200 and reply.content_type == "application/json"


def test_a_batch_returns_an_array_in_prompt_order(sglang: Conformance) -> None:
    prompts = [chat("One?"), chat("Two, please?"), chat("Three, if you would be so kind?")]
    batch = sglang.ok({"input_ids": prompts, "sampling_params": GREEDY})
    assert [r["meta_info"]["prompt_tokens"] for r in batch] == [len(p) for p in prompts]
    assert [r["output_ids"] for r in batch] == [greedy(sglang, p)["output_ids"] for p in prompts]


def test_text_list_of_one_returns_an_array(sglang: Conformance) -> None:
    result = sglang.ok({"text": ["Hello"], "sampling_params": {"max_new_tokens": 4}})
    assert isinstance(result, list) and len(result) == 1


def test_parallel_sampling_is_prompt_major_with_fresh_rids(sglang: Conformance) -> None:
    prompts = [chat("Short?"), chat("A somewhat longer question, then?")]
    body = {"input_ids": prompts, "rid": ["a", "b"], "sampling_params": {"n": 3, "temperature": 0.5}}
    result = sglang.ok(body)
    assert [r["meta_info"]["prompt_tokens"] for r in result] == [len(prompts[0])] * 3 + [len(prompts[1])] * 3
    rids = [r["meta_info"]["id"] for r in result]
    assert len(set(rids)) == 6 and not {"a", "b"} & set(rids)


def test_n_on_a_single_prompt_returns_an_array_of_n(sglang: Conformance) -> None:
    result = sglang.ok(
        {"input_ids": PROMPT, "sampling_params": {"n": 3, "temperature": 0.5, "max_new_tokens": 8}}
    )
    assert isinstance(result, list) and len(result) == 3


def test_output_ids_include_the_eos_and_text_leaves_it_out(sglang: Conformance) -> None:
    result = greedy(sglang)
    assert result["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    assert result["output_ids"][-1] == EOS
    assert result["text"] == decode(result["output_ids"][:-1])


def test_stop_token_ids_end_the_output_with_the_matched_id(sglang: Conformance) -> None:
    full = greedy(sglang)["output_ids"]
    stop = full[5]
    result = greedy(sglang, stop_token_ids=[stop])
    assert result["output_ids"] == full[: full.index(stop) + 1]
    assert result["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_a_stop_string_ends_the_ids_with_the_token_that_completes_it(sglang: Conformance) -> None:
    full = greedy(sglang)["output_ids"]
    text = decode(full, skip_special_tokens=False)
    stop = text[20:26]
    cut = next(k for k in range(1, len(full) + 1) if stop in decode(full[:k], skip_special_tokens=False))
    result = greedy(sglang, stop=[stop])
    assert result["output_ids"] == full[:cut]
    assert result["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert result["text"] == text[: text.index(stop)]


def test_no_stop_trim_keeps_the_stop_in_the_text_only(sglang: Conformance) -> None:
    full = greedy(sglang)["output_ids"]
    stop = decode(full)[20:26]
    trimmed, kept = greedy(sglang, stop=stop), greedy(sglang, stop=stop, no_stop_trim=True)
    assert kept["output_ids"] == trimmed["output_ids"]
    assert kept["text"] == trimmed["text"] + stop
    raw = greedy(sglang, no_stop_trim=True, skip_special_tokens=False)
    assert raw["text"].endswith("<|im_end|>") and raw["output_ids"] == full


def test_a_stop_regex_reports_the_pattern(sglang: Conformance) -> None:
    result = greedy(sglang, stop_regex=[r"\d+"])
    assert result["meta_info"]["finish_reason"] == {"type": "stop", "matched": r"\d+"}
    assert result["output_ids"] == greedy(sglang)["output_ids"][: len(result["output_ids"])]


def test_a_length_finish_reports_max_new_tokens(sglang: Conformance) -> None:
    result = greedy(sglang, max_new_tokens=7)
    assert len(result["output_ids"]) == result["meta_info"]["completion_tokens"] == 7
    assert result["meta_info"]["finish_reason"] == {"type": "length", "length": 7}


def test_max_new_tokens_defaults_to_128(sglang: Conformance) -> None:
    result = sglang.ok({"input_ids": PROMPT, "sampling_params": {"ignore_eos": True}})
    assert result["meta_info"]["finish_reason"] == {"type": "length", "length": 128}
    assert len(result["output_ids"]) == 128


def test_max_new_tokens_zero_returns_no_ids(sglang: Conformance) -> None:
    result = greedy(sglang, max_new_tokens=0)
    assert result["output_ids"] == [] and result["meta_info"]["finish_reason"] == {
        "type": "length",
        "length": 0,
    }


def test_the_text_of_an_input_ids_request_is_the_completion_not_the_prompt(sglang: Conformance) -> None:
    result = greedy(sglang, max_new_tokens=12)
    assert result["text"] == decode(result["output_ids"]) and "What is a river" not in result["text"]


def test_return_prompt_token_ids_adds_the_prompt(sglang: Conformance) -> None:
    result = sglang.ok(
        {"text": "Hello there", "return_prompt_token_ids": True, "sampling_params": {"max_new_tokens": 2}}
    )
    assert result["prompt_token_ids"] == TOKENIZER.encode("Hello there").ids
    assert list(result) == ["text", "output_ids", "meta_info", "prompt_token_ids"]


def test_greedy_decoding_is_deterministic(sglang: Conformance) -> None:
    assert greedy(sglang)["output_ids"] == greedy(sglang)["output_ids"]


def test_sampling_seed_makes_sampling_reproducible(sglang: Conformance) -> None:
    def sample(seed: int) -> list[int]:
        body = {"input_ids": PROMPT, "sampling_params": {"temperature": 1.0, "sampling_seed": seed}}
        ids: list[int] = sglang.ok(body)["output_ids"]
        return ids

    assert sample(7) == sample(7)
    assert len({tuple(sample(seed)) for seed in range(6)}) > 1


def test_put_works_like_post(sglang: Conformance) -> None:
    assert (
        sglang.generate({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}}, method="PUT").status
        == 200
    )


# --- §4 streaming ----------------------------------------------------------------------------


def stream(sglang: Conformance, body: dict[str, Any]) -> list[Any]:
    events: list[Any] = sglang.ok({**body, "stream": True})
    return events


def test_a_stream_is_data_lines_ending_with_done(sglang: Conformance) -> None:
    reply = sglang.generate({"input_ids": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 5}})
    assert reply.status == 200 and reply.content_type == "text/event-stream"
    assert reply.body.endswith(b"data: [DONE]\n\n") and all(
        block.startswith(b"data: ") for block in reply.body.split(b"\n\n") if block
    )


def test_stream_chunks_are_cumulative_and_the_last_equals_the_non_stream_response(
    sglang: Conformance,
) -> None:
    events = stream(sglang, {"input_ids": PROMPT, "sampling_params": GREEDY})[:-1]
    ids = [event["output_ids"] for event in events]
    assert all(ids[i] == ids[i + 1][: len(ids[i])] for i in range(len(ids) - 1))
    assert [len(x) for x in ids] == list(range(1, len(ids) + 1))
    assert without_timing(events[-1]) == without_timing(greedy(sglang))
    assert "e2e_latency" in events[-1]["meta_info"] and "e2e_latency" not in events[0]["meta_info"]


def test_finish_reason_is_null_until_the_last_chunk(sglang: Conformance) -> None:
    events = stream(sglang, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6}})[:-1]
    assert [e["meta_info"]["finish_reason"] for e in events[:-1]] == [None] * (len(events) - 1)
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 6}


def test_batch_stream_chunks_carry_index_and_single_streams_do_not(sglang: Conformance) -> None:
    body = {"input_ids": [chat("a?"), chat("bb?")], "sampling_params": {"n": 2, "max_new_tokens": 3}}
    events = stream(sglang, body)[:-1]
    assert sorted({e["index"] for e in events}) == [0, 1, 2, 3]
    finals = {e["index"]: e for e in events if e["meta_info"]["finish_reason"]}
    assert [finals[i]["meta_info"]["prompt_tokens"] for i in range(4)] == [len(chat("a?"))] * 2 + [
        len(chat("bb?"))
    ] * 2
    single = stream(sglang, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3}})[:-1]
    assert all("index" not in e for e in single)


@pytest.mark.parametrize(
    ("interval", "lengths"), [(1, list(range(1, 11))), (4, [1, 5, 9, 10]), (5, [1, 6, 10]), (20, [1, 10])]
)
def test_stream_interval_sets_the_chunk_cadence(
    sglang: Conformance, interval: int, lengths: list[int]
) -> None:
    """The first token at once, then each time ``interval`` tokens are unsent, then the final chunk."""
    sampling = {"max_new_tokens": 10, "ignore_eos": True, "stream_interval": interval}
    events = stream(sglang, {"input_ids": PROMPT, "sampling_params": sampling})
    assert [len(e["output_ids"]) for e in events[:-1]] == lengths


def test_a_chunk_whose_text_could_end_in_a_stop_string_is_held_to_the_next_token(sglang: Conformance) -> None:
    full = greedy(sglang, max_new_tokens=40, ignore_eos=True)["output_ids"]
    last_char = decode(full[:6], skip_special_tokens=False)[-1]
    stop = last_char + "\u2603"  # never completed: the output stays the same, only chunks are held
    sampling = {**GREEDY, "max_new_tokens": 40, "ignore_eos": True, "stop": stop, "stream_interval": 5}
    events = stream(sglang, {"input_ids": PROMPT, "sampling_params": sampling})[:-1]
    expected, sent = [], 0
    for k in range(1, len(full)):
        held = decode(full[:k], skip_special_tokens=False).endswith(last_char)
        if (sent == 0 or k - sent >= 5) and not held:
            expected.append(k)
            sent = k
    assert [len(e["output_ids"]) for e in events] == [*expected, 40] and 6 not in expected
    assert events[-1]["output_ids"] == full


def test_errors_after_the_stream_started_arrive_as_one_event_with_http_200(sglang: Conformance) -> None:
    events = stream(sglang, {"input_ids": PROMPT, "sampling_params": {"top_k": 0}})
    assert events == [
        {
            "error": {
                "message": "top_k must be -1 (disable) or at least 1, got 0.",
                "type": "invalid_request_error",
                "code": 400,
                "retryable": False,
            }
        },
        "[DONE]",
    ]


def test_contract_errors_of_a_stream_request_are_plain_400s(sglang: Conformance) -> None:
    reply = sglang.generate({"input_ids": PROMPT, "stream": True, "sampling_params": {"seed": 1}})
    assert reply.status == 400 and reply.content_type == "application/json"


# --- §9 behaviours not covered above ---------------------------------------------------------


def test_flush_cache_then_cached_tokens_count_the_longest_cached_prefix(sglang: Conformance) -> None:
    assert request(sglang.url, "/flush_cache", method="POST").status == 200

    def cached(n: int) -> int:
        body = {"input_ids": list(range(n)), "sampling_params": {"max_new_tokens": 1}}
        value: int = sglang.ok(body)["meta_info"]["cached_tokens"]
        return value

    assert [cached(100), cached(1000), cached(1000), cached(100), cached(2000)] == [0, 100, 999, 99, 1000]


def test_samples_of_one_prompt_hit_the_prefix_cache(sglang: Conformance) -> None:
    prompt = chat("A prompt nobody sent before: 8dc1f?")
    result = sglang.ok({"input_ids": prompt, "sampling_params": {"n": 4, "max_new_tokens": 4}})
    assert [r["meta_info"]["cached_tokens"] for r in result] == [len(prompt) - 1] * 4


def test_input_ids_are_sent_verbatim_and_not_range_checked(sglang: Conformance) -> None:
    result = sglang.ok({"input_ids": [999_999, 6143, 0], "sampling_params": {"max_new_tokens": 3}})
    assert result["meta_info"]["prompt_tokens"] == 3


@pytest.mark.parametrize(
    "body",
    [
        {"input_ids": PROMPT, "token_ids_logprob": [0]},
        {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "top_k": -1, "min_p": 0.1}},
        {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "custom_params": {"x": 1}}},
        {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "temperature": None}},
        {"input_ids": PROMPT, "rid": None, "sampling_params": {"max_new_tokens": 2, "stop": None}},
    ],
)
def test_requests_the_contract_accepts_are_served(sglang: Conformance, body: dict[str, Any]) -> None:
    assert sglang.generate(body).status == 200


def test_a_null_stream_is_refused_by_fastapi_though_the_contract_accepts_it(sglang: Conformance) -> None:
    reply = sglang.generate({"input_ids": PROMPT, "stream": None})
    assert reply.status == 400 and reply.json()["type"] == "Bad Request"
