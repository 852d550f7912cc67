"""The request gates, normalization and sampling rules of ``eagle3_raw.sglang.protocol``.

The contract gate is compared with SGLang's own ``GenerateRequest.from_json_value`` on a large
generated corpus: same accept/refuse decision, same refusal text.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import pytest

from eagle3_raw.sglang import protocol as p
from tests.reference.contract import contract_error

VOCAB = 6144


def _gate2(body: Any) -> str | None:
    try:
        p.check_contract(body)
    except p.GateError as exc:
        return str(exc.body["error"])
    return None


def _gate1(body: Any) -> dict[str, Any] | None:
    try:
        p.check_fields(body)
    except p.GateError as exc:
        return exc.body
    return None


_SCALARS: list[Any] = [
    None, True, False, 0, 1, -1, 2.5, 1.0, "x", "", [], {}, [1], ["a"], [None], [[1]], {"a": 1},
    {"url": "u"}, [1, 2.5], [True], [[1, "a"]], {"seed": 1}, -5, {"enabled": True, "x": 1},
]  # fmt: skip


def _random_body(rng: random.Random, top: list[str], sampling: list[str]) -> dict[str, Any]:
    def value(depth: int = 0) -> Any:
        r = rng.random()
        if r < 0.6 or depth > 2:
            return rng.choice(_SCALARS)
        if r < 0.8:
            return [value(depth + 1) for _ in range(rng.randrange(3))]
        return {rng.choice(sampling): value(depth + 1) for _ in range(rng.randrange(3))}

    body = {rng.choice(top): value() for _ in range(rng.randrange(4))}
    if rng.random() < 0.5:
        params = {rng.choice(sampling): value() for _ in range(rng.randrange(4))}
        body["sampling_params"] = params if rng.random() < 0.7 else [params, {rng.choice(sampling): value()}]
    return body


def test_contract_gate_matches_sglangs_contract_on_generated_bodies(contract: ModuleType) -> None:
    rng = random.Random(20260)
    top = [*contract.GenerateRequest.__struct_fields__, "unknown_key"]
    sampling = [*contract.SamplingParams.__struct_fields__, "seed", "max_tokens"]
    for _ in range(30000):
        body = _random_body(rng, top, sampling)
        assert _gate2(body) == contract_error(contract, body), body


@pytest.mark.parametrize(
    "body",
    [
        {"input_ids": [1, 2], "sampling_params": {"seed": 4}},
        {"input_ids": [1, 2], "sampling_params": {"max_tokens": 4}},
        {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": "8"}},
        {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 8.0}},
        {"input_ids": [1, 2], "sampling_params": {"temperature": "0"}},
        {"input_ids": [1, 2], "sampling_params": [{"n": 1}, {"top_k": 1.5}]},
        {"input_ids": [1, True]},
        {"input_ids": [[1, 2], [3, 4.0]]},
        {"input_ids": ["a"]},
        {"text": 5},
        {"text": ["a", 5]},
        {"input_ids": [1], "stream": 1},
        {"input_ids": [1], "rid": 7},
        {"input_ids": [1], "return_prompt_token_ids": None},
        {"input_ids": [1], "max_thinking_tokens": -1},
        {"input_ids": [1], "image_data": [{"url": "u", "bogus": 1}]},
        {"input_ids": [1], "sampling_params": {"watermark": {"enabled": True, "strength": 2}}},
    ],
)
def test_contract_gate_words_refusals_like_sglang(contract: ModuleType, body: dict[str, Any]) -> None:
    expected = contract_error(contract, body)
    assert expected is not None
    assert _gate2(body) == expected


def test_unknown_sampling_key_names_every_allowed_key() -> None:
    text = _gate2({"input_ids": [1], "sampling_params": {"seed": 1}})
    assert text is not None and text.startswith(
        "unknown field `seed`, expected one of `max_new_tokens`, `stop`"
    )
    assert text.endswith("`watermark`, `choice`")


def test_unknown_top_level_keys_are_ignored() -> None:
    assert _gate1({"input_ids": [1], "whatever": {"x": 1}}) is None
    assert _gate2({"input_ids": [1], "whatever": {"x": 1}}) is None


@pytest.mark.parametrize(
    "body",
    [
        {"input_ids": "abc"},
        {"input_ids": [1.5, 2]},
        {"input_ids": [1, 2.5]},
        {"input_ids": [[1], "x"]},
        {"input_ids": [2**63]},
        {"text": 5},
        {"stream": "maybe", "input_ids": [1]},
        {"stream": None, "input_ids": [1]},
        {"sampling_params": "hot", "input_ids": [1]},
        {"rid": 5, "input_ids": [1]},
        [1, 2, 3],
    ],
)
def test_validation_gate_refuses_what_fastapi_refuses(body: Any) -> None:
    error = _gate1(body)
    assert error is not None
    assert error["object"] == "error" and error["type"] == "Bad Request" and error["code"] == 400
    assert error["param"] is None and "validation error" in error["message"]


@pytest.mark.parametrize(
    "body", [{"input_ids": [1], "stream": 1}, {"input_ids": [1], "stream": "yes"}, {"input_ids": [1, True]}]
)
def test_validation_gate_is_lax_where_pydantic_is(body: dict[str, Any]) -> None:
    assert _gate1(body) is None and _gate2(body) is not None  # the contract refuses it instead


# --- normalization ---------------------------------------------------------------------------


def test_flat_input_ids_are_one_prompt_nested_ones_a_batch() -> None:
    single = p.normalize({"input_ids": [1, 2, 3]})
    batch = p.normalize({"input_ids": [[1, 2, 3]]})
    assert single.is_single and [i.prompt for i in single.items] == [[1, 2, 3]]
    assert not batch.is_single and [i.prompt for i in batch.items] == [[1, 2, 3]]


def test_text_list_of_one_is_a_batch() -> None:
    assert not p.normalize({"text": ["hi"]}).is_single
    assert p.normalize({"text": "hi"}).is_single


def test_n_turns_a_single_prompt_into_a_prompt_major_batch_with_fresh_rids() -> None:
    req = p.normalize({"input_ids": [[1], [2]], "rid": ["a", "b"], "sampling_params": {"n": 3}})
    assert not req.is_single and req.n == 3
    assert [item.prompt for item in req.items] == [[1]] * 3 + [[2]] * 3
    assert len({item.rid for item in req.items}) == 6 and not {"a", "b"} & {item.rid for item in req.items}
    assert req.rids == ("a", "b")
    single = p.normalize({"input_ids": [1], "sampling_params": {"n": 3}})
    assert not single.is_single and len(single.items) == 3


def test_n_must_be_the_same_in_every_sampling_params() -> None:
    with pytest.raises(p.RequestError, match="parallel_sample_num should be the same"):
        p.normalize({"input_ids": [[1], [2]], "sampling_params": [{"n": 2}, {"n": 3}]})


def test_a_string_rid_of_a_batch_becomes_rid_underscore_index() -> None:
    req = p.normalize({"input_ids": [[1], [2]], "rid": "r"})
    assert [item.rid for item in req.items] == ["r_0", "r_1"]


def test_a_rid_list_must_match_the_batch() -> None:
    with pytest.raises(p.RequestError, match="rids length mismatch"):
        p.normalize({"input_ids": [[1], [2]], "rid": ["a"]})


def test_duplicate_rids_within_one_batch_are_refused() -> None:
    with pytest.raises(p.RequestError, match=r"Duplicate request IDs detected within the request: \['a'\]"):
        p.normalize({"input_ids": [[1], [2]], "rid": ["a", "a"]})


@pytest.mark.parametrize(
    "key", ["return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob"]
)
def test_list_valued_options_are_refused_with_n(key: str) -> None:
    value = [[1], [2]] if key == "token_ids_logprob" else [0, 0]
    with pytest.raises(p.RequestError, match=f"Cannot use list {key} with parallel_sample_num > 1"):
        p.normalize({"input_ids": [[1], [2]], key: value, "sampling_params": {"n": 2}})


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "Either text, input_ids or input_embeds should be provided."),
        ({"input_ids": []}, "input_ids cannot be empty."),
        ({"text": "a", "input_ids": [1], "input_embeds": [[0.5]]}, "Either text, input_ids or input_embeds"),
    ],
)
def test_inputs_are_required(body: dict[str, Any], message: str) -> None:
    with pytest.raises(p.RequestError, match=message.replace(".", r"\.")):
        p.normalize(body)


@pytest.mark.parametrize(
    "body",
    [
        {"input_ids": [[1], [2]], "sampling_params": [{}]},
        {"input_ids": [1], "rid": ["a"]},
        {"input_ids": [1], "sampling_params": []},
    ],
)
def test_where_sglang_crashes_the_reference_answers_500(body: dict[str, Any]) -> None:
    with pytest.raises(p.InternalServerError):
        p.normalize(body)


# --- sampling_params -------------------------------------------------------------------------


def _sampling(raw: dict[str, Any], *, tokenizer: bool = True) -> p.Sampling:
    return p.parse_sampling(raw, VOCAB, has_tokenizer=tokenizer)


def test_sampling_defaults_are_the_contracts(contract: ModuleType) -> None:
    ours, theirs = _sampling({}), contract.SamplingParams()
    for name in p.Sampling.__dataclass_fields__:
        expected = getattr(theirs, name)
        expected = () if name in ("stop", "stop_regex") and expected is None else expected
        expected = frozenset() if name == "stop_token_ids" and expected is None else expected
        assert getattr(ours, name) == expected, name
    assert _sampling({"max_new_tokens": None}).max_new_tokens is None  # null: up to the context


@pytest.mark.parametrize("temperature", [0, 0.0, 5e-7])
def test_temperature_below_1e6_is_greedy(temperature: float) -> None:
    s = _sampling({"temperature": temperature})
    assert s.greedy and s.top_k == 1 and s.temperature == 1.0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"top_k": 0}, "top_k must be -1 (disable) or at least 1, got 0."),
        ({"top_p": 0}, "top_p must be in (0, 1], got 0."),
        ({"temperature": -1}, "temperature must be a non-negative finite number, got -1."),
        ({"min_p": 1.5}, "min_p must be in [0, 1], got 1.5."),
        ({"frequency_penalty": 3}, "frequency_penalty must be in [-2, 2], got 3."),
        ({"presence_penalty": -3}, "presence_penalty must be in [-2, 2], got -3."),
        ({"repetition_penalty": 0}, "repetition_penalty must be in (0, 2] (1.0 = no penalty), got 0."),
        ({"max_new_tokens": -1}, "max_new_tokens must be at least 0, got -1."),
        (
            {"min_new_tokens": 5, "max_new_tokens": 2},
            "min_new_tokens must be in [0, max_new_tokens(2)], got 5.",
        ),
        ({"logit_bias": {"9999": 1.0}}, "logit_bias must has keys in [0, 6143], got 9999."),
        ({"sampling_seed": 2**63}, f"sampling_seed must be in [-2**63, 2**63 - 1], got {2**63}."),
        ({"regex": "a", "ebnf": "b"}, "Only one of json_schema, regex, ebnf, or structural_tag can be set."),
        ({"stop": ["x"] * 33}, "at most 32 stop strings are allowed, got 33"),
        ({"beam_width": 0}, "beam_width must be at least 1, got 0."),
    ],
)
def test_sampling_values_are_verified_in_sglangs_words(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(p.RequestError) as caught:
        _sampling(raw)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"stop": "x"}, "stop=['x'] is unavailable when skip_tokenizer_init=True"),
        ({"stop_regex": "x+"}, "stop_regex=['x+'] is unavailable when skip_tokenizer_init=True"),
        ({"min_new_tokens": 2}, "min_new_tokens=2 is unavailable when skip_tokenizer_init=True"),
    ],
)
def test_text_features_are_refused_without_a_tokenizer(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(p.RequestError, match=re.escape(message)):
        _sampling(raw, tokenizer=False)


@pytest.mark.parametrize(
    "raw", [{"regex": "a+"}, {"json_schema": "{}"}, {"logit_bias": {"5": 1.0}}, {"beam_width": 2}]
)
def test_features_the_engine_lacks_are_refused_not_ignored(raw: dict[str, Any]) -> None:
    with pytest.raises(p.RequestError, match="not supported by the reference server"):
        _sampling(raw)


def test_the_contract_only_key_choice_crashes_like_sglang() -> None:
    with pytest.raises(p.InternalServerError):
        _sampling({"choice": ["a"]})


# --- length limits ---------------------------------------------------------------------------


def test_tokenizer_manager_refuses_prompts_that_do_not_fit_the_context() -> None:
    with pytest.raises(
        p.RequestError, match=r"The input \(1000 tokens\) is longer than the model's context length"
    ):
        p.check_context(1000, None, 1000)
    with pytest.raises(
        p.RequestError, match="Requested token count exceeds the model's maximum context length of 1000"
    ):
        p.check_context(900, 101, 1000)
    p.check_context(900, 100, 1000)
    p.check_context(999, None, 1000)  # the 128 default is applied later and not checked here


def test_scheduler_refuses_long_prompts_and_clips_max_new_tokens_silently() -> None:
    limits = p.SchedulerLimits(context_len=1000, max_total_num_tokens=10**6)
    assert limits.max_req_input_len == 994
    assert limits.refusal(993) is None
    assert limits.refusal(994) == (
        "Input length (994 tokens) exceeds the maximum allowed length (994 tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    )
    assert limits.clip(900, 128) == 98 == 1000 - 2 - 900
    assert limits.clip(10, 128) == 128
    assert limits.clip(10, None) == 988


# --- outputs ---------------------------------------------------------------------------------


def _decode(ids: Any, skip_special: bool = False) -> str:
    words = {1: "a", 2: "b", 3: "c", 9: "<eos>"}
    return "".join(words[i] for i in ids if not (skip_special and i == 9))


def test_a_stop_string_ends_the_ids_with_the_token_that_completes_it() -> None:
    sampling = _sampling({"stop": ["bc", "zz"]})
    assert p.find_stop([1, 2, 3, 1, 9], sampling, _decode) == (3, "bc")
    assert p.find_stop([1, 1, 9], sampling, _decode) is None


def test_stop_strings_are_checked_before_stop_regexes() -> None:
    sampling = _sampling({"stop": "ab", "stop_regex": "a"})
    assert p.find_stop([1, 2], sampling, _decode) == (1, "a")
    assert p.find_stop([2, 1, 2], _sampling({"stop": "ab", "stop_regex": "b+"}), _decode) == (1, "b+")


def test_text_drops_a_matched_stop_token_and_cuts_a_stop_string() -> None:
    plain = _sampling({})
    assert p.output_text([1, 2, 9], p.finish_stop(9), plain, _decode) == "ab"
    keep = _sampling({"no_stop_trim": True, "skip_special_tokens": False})
    assert p.output_text([1, 2, 9], p.finish_stop(9), keep, _decode) == "ab<eos>"
    assert p.output_text([1, 2, 9], p.finish_stop(9), _sampling({"no_stop_trim": True}), _decode) == "ab"
    assert p.output_text([1, 2, 3], p.finish_stop("bc"), plain, _decode) == "a"
    assert p.output_text([1, 2, 3], p.finish_stop("bc"), _sampling({"no_stop_trim": True}), _decode) == "abc"
    assert p.output_text([1, 2, 3], p.finish_length(3), plain, _decode) == "abc"


# --- stream chunk cadence (SGLang 0.5.23 ``OutputStreamer.accept``) -------------------------------


@pytest.mark.parametrize(
    ("length", "interval", "expected"),
    [
        (12, 5, [1, 6, 11]),
        (20, 5, [1, 6, 11, 16]),
        (10, 4, [1, 5, 9]),
        (6, 1, [1, 2, 3, 4, 5]),
        (1, 5, []),
        (5, -3, [1, 2, 3, 4]),  # SGLang does not validate it: any count of unsent tokens is enough
    ],
)
def test_a_stream_sends_the_first_token_then_every_interval_after_the_last_chunk(
    length: int, interval: int, expected: list[int]
) -> None:
    assert p.chunk_lengths(length, interval) == expected


def test_a_held_back_chunk_goes_out_at_the_next_token_and_restarts_the_interval() -> None:
    assert p.chunk_lengths(14, 5, {1, 7}.__contains__) == [2, 8, 13]
    assert p.chunk_lengths(6, 1, {2, 3}.__contains__) == [1, 4, 5]


def _chars(ids: Sequence[int]) -> str:
    return "".join(map(chr, ids))


def test_a_chunk_is_held_while_the_decoded_tail_could_start_a_stop_string() -> None:
    out = [ord(c) for c in "xyabcab"]
    held = p.stop_prefix_hold(out, _sampling({"stop": ["abz"]}), len, _chars)
    assert [k for k in range(1, len(out) + 1) if held(k)] == [3, 4, 6, 7]  # ...a, ...ab
    assert p.stop_prefix_hold(out, _sampling({}), len, _chars) is p.never_held
    assert p.stop_prefix_hold(out, _sampling({"stop": [""]}), len, _chars) is p.never_held


def test_the_tail_is_the_longest_stop_string_in_tokens_plus_one_unless_a_stop_regex_widens_it() -> None:
    out = [ord(c) for c in "xabc"]

    def one_token(stop: str) -> int:
        return 1  # "abcd" as a single token: the tail is the last 2 ids, "bc"

    assert not p.stop_prefix_hold(out, _sampling({"stop": ["abcd"]}), one_token, _chars)(4)
    widened = _sampling({"stop": ["abcd"], "stop_regex": ["q+"]})
    assert p.stop_prefix_hold(out, widened, one_token, _chars)(4)
