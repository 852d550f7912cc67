"""``/tokenize`` with ``messages`` (§14.1), ``--chat-template`` and ``--model-path`` a foreign tokenizer
folder: the running server answers what SGLang 0.5.23's own ``/tokenize`` code answers
(``tests/support/sglang_oracle.py``) for the chat-path corpus of ``tests/test_chatpath.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from eagle3_raw.launching.reference import ReferenceProcess
from eagle3_raw.reference.model_files import load_tokenizer
from eagle3_raw.sglang import chatpath
from tests.reference.wire import get, request
from tests.support import sglang_oracle, tokenizers
from tests.test_chatpath import CORPUS, REFERENCE_TEMPLATE

QWEN3_EOS = 151645  # <|im_end|>


def _assert_same(url: str, oracle: Any, path: str = "/tokenize") -> None:
    for case, body in CORPUS.items():
        status, expected = sglang_oracle.tokenize(oracle, copy.deepcopy(body))
        reply = request(url, path, body)
        assert reply.status == status, (case, reply.json(), expected)
        got = reply.json()
        if status == 200:
            assert got == expected, case
        elif "validation" in expected:
            assert got["type"] == "Bad Request" and got["code"] == 400, case
        else:
            assert got == expected, case


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/tokenize", "/v1/tokenize"])
def test_reference_model_renders_as_sglang(server: ReferenceProcess, path: str) -> None:
    _assert_same(server.url, sglang_oracle.chat_server(load_tokenizer()), path)


def test_body_shape_refusals(server: ReferenceProcess) -> None:
    user = [{"role": "user", "content": "hi"}]
    for body in ({"prompt": "hi", "messages": user}, {"add_special_tokens": False}):
        reply = request(server.url, "/tokenize", body)
        assert reply.status == 400 and "Exactly one of 'prompt' or 'messages'" in reply.json()["message"]
    streamed = request(server.url, "/tokenize", {"messages": user, "stream": True})
    assert streamed.status == 501 and streamed.json()["type"] == "NotImplementedError"


@pytest.mark.slow
def test_foreign_tokenizer_folder_renders_tokenizes_and_generates(
    launch: Callable[..., ReferenceProcess],
) -> None:
    folder = tokenizers.tokenizer_folder("qwen3")
    tokenizer = tokenizers.load("qwen3")
    server = launch("--model-path", str(folder))
    _assert_same(server.url, sglang_oracle.chat_server(tokenizers.load("qwen3")))
    info = get(server.url, "/model_info").json()
    assert info["model_path"] == info["tokenizer_path"] == str(folder.resolve())
    assert get(server.url, "/v1/models").json()["data"][0]["id"] == str(folder.resolve())
    assert get(server.url, "/server_info").json()["max_req_input_len"] > 4096
    prompt = chatpath.render_prompt_ids(tokenizer, [{"role": "user", "content": "Tell me about rivers."}])
    outputs = [_generate(server.url, prompt, seed) for seed in (1, 1, 2, 3, 4)]
    assert outputs[0] == outputs[1], "same prompt, params and seed must give the same ids"
    assert len({tuple(ids) for ids in outputs}) >= 3, "different seeds should vary the output"
    for ids in outputs:
        assert all(0 <= i < len(tokenizer) for i in ids) and ids[-1] == QWEN3_EOS
        assert QWEN3_EOS not in ids[:-1]
        assert tokenizer.decode(ids[:-1]).strip(), "the answer is text in this vocabulary"


def _generate(url: str, ids: list[int], seed: int) -> list[int]:
    sampling = {"max_new_tokens": 400, "temperature": 0.8, "sampling_seed": seed}
    reply = request(url, "/generate", {"input_ids": ids, "sampling_params": sampling})
    assert reply.status == 200, reply.json()
    output_ids: list[int] = reply.json()["output_ids"]
    return output_ids


@pytest.mark.slow
def test_chat_template_file_replaces_the_tokenizers(launch: Callable[..., ReferenceProcess]) -> None:
    """gpt-oss's npm tokenizer has no template: refused until ``--chat-template`` gives one.

    Slow on a busy machine (two servers and two oracles each load a 200k-token vocabulary): every
    limit it waits under is stretched by the machine's pace (the servers' start-up, the requests'
    timeouts, the test's own), and the vocabulary is loaded once here."""
    folder = tokenizers.tokenizer_folder("gptoss")
    theirs = tokenizers.load("gptoss")
    bare = launch("--model-path", str(folder))
    _assert_same(bare.url, sglang_oracle.chat_server(theirs, model_type="gpt_oss"))
    assert request(bare.url, "/tokenize", CORPUS["plain"]).status == 400
    server = launch("--model-path", str(folder), "--chat-template", str(REFERENCE_TEMPLATE))
    theirs.chat_template = chatpath.read_template_file(REFERENCE_TEMPLATE)
    _assert_same(server.url, sglang_oracle.chat_server(theirs, model_type="gpt_oss"))
    assert get(server.url, "/server_info").json()["chat_template"] == str(REFERENCE_TEMPLATE)
