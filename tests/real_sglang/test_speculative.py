"""Acceptance per row on the real SGLang (issue 24): its speculative path on this CPU is NGRAM.

What SGLang 0.5.23 runs here (see the README's "What ran against the real SGLang"): the EAGLE
family (EAGLE, EAGLE3, STANDALONE) stops at start-up, its draft model having no attention
backend on a CPU without AMX (``speculative/draft_utils.py``: "EAGLE is not supported in decode
attention backend torch_native"; the ``triton`` draft backend has no CPU driver). NGRAM (a draft
tree from the request's own n-grams, no draft model) runs through SGLang's own scheduler, verify,
accept bookkeeping and ``meta_info`` figures, with two things from ``tests/real_sglang/site``: the
``sgl_kernel`` CPU helpers its verify calls (written in plain torch there), and the reference
model class, which answers a verify step's tree for every node (it computes no attention:
``torch_native`` itself fails a verify forward, its extend path reading ``extend_prefix_lens``,
which a verify batch does not set).

So here: a set built through a speculating real server keeps, in each row's ``meta``, exactly the
``spec_*`` figures the server returned for that row (read from the server's own request log), the
set's target names the drafter as ``/server_info`` reports it, and the token rows are those of
the same recipe on the shared, non-speculating server.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import eagle3_raw
from eagle3_raw.resources import reference_model_dir
from eagle3_raw.rows import SPEC_FIELDS
from eagle3_raw.sglang.model import DRAFTER_KEYS, DRAFTER_SETTING_KEYS
from tests.helpers import rid_row_id, write_prompts, write_recipe
from tests.real_sglang.conftest import SERVER_FLAGS
from tests.real_sglang.server import MODEL_FILES, RealSGLang, get, launch_real

# NGRAM with SGLang's defaults but one: a draft tree of 12 nodes (breadth up to 10) per verify step;
# the n-gram trie's capacity 100,000 ids, not 10,000,000 (1.8 GB allocated at start: on this shared
# machine the start-up memory check, which counts it against --mem-fraction-static, then failed).
NGRAM = (
    "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "12",
    "--speculative-ngram-capacity", "100000",
)  # fmt: skip
PROMPTS = 16
SAMPLING = {"max_new_tokens": 96, "temperature": 0.0}


@pytest.fixture()
def ngram_server(real_venv: Path, real_model: Path, real_logs: Path) -> Iterator[RealSGLang]:
    """A real SGLang speculating with NGRAM (the shared server's flags otherwise), stopped after
    the test (an idle real scheduler keeps most of a core busy)."""
    with launch_real(real_model, *SERVER_FLAGS, *NGRAM, log_dir=real_logs / "ngram") as server:
        yield server


def _load(recipe: Path, folder: Path, name: str) -> Any:
    return eagle3_raw.load(
        str(recipe), cache_dir=str(folder / f"cache-{name}"), journal_dir=folder / f"journals-{name}",
        progress="none",
    )  # fmt: skip


def _returned(server: RealSGLang) -> dict[str, dict[str, Any]]:
    """What the server returned for each row (its request log's ``request.finished`` events, at
    ``--log-requests-level 0``: the whole ``meta_info``), by row id; the last answer of a row."""
    answers: dict[str, dict[str, Any]] = {}
    for event in server.requests():
        rid = str(event.get("rid", ""))
        if event.get("event") != "request.finished" or "#" not in rid:
            continue
        meta = event["out"]["meta_info"]
        if meta["finish_reason"]["type"] in ("stop", "length"):
            answers[rid_row_id(rid)] = meta
    return answers


def test_rows_keep_the_real_servers_speculative_figures_and_the_set_names_its_drafter(
    tmp_path: Path, ngram_server: RealSGLang, real_server: RealSGLang, real_model: Path
) -> None:
    write_prompts(tmp_path, PROMPTS)
    model = {"tokenizer": str(real_model)}
    recipe = write_recipe(tmp_path, endpoints=[ngram_server.url], model=model, sampling=SAMPLING)
    rows = _load(recipe, tmp_path, "ngram")
    returned = _returned(ngram_server)
    assert len(rows) == PROMPTS and set(rows["id"]) <= set(returned)
    measured = 0
    for row in rows:
        sent, meta = returned[row["id"]], row["meta"]
        generated = len(row["input_ids"]) - row["prompt_len"]
        assert meta["completion_tokens"] == sent["completion_tokens"] == generated
        if "spec_verify_ct" not in sent:  # one output id (from the prefill): no verify step
            assert sent["completion_tokens"] == 1 and all(meta[name] is None for name in SPEC_FIELDS)
            continue
        measured += 1
        kept = {name: meta[name] for name in SPEC_FIELDS}
        assert kept == {name: sent[name] for name in SPEC_FIELDS}, row["id"]
        # SGLang's own definitions, on what it returned
        assert meta["spec_accept_length"] == meta["completion_tokens"] / meta["spec_verify_ct"]
        assert meta["spec_num_proposed_drafts"] == meta["spec_verify_ct"] * 11  # 12 draft tokens: 11 drafts
        assert sum(meta["spec_correct_drafts_histogram"]) == meta["spec_verify_ct"]
    assert measured >= PROMPTS - 1
    assert sum(row["meta"]["spec_num_correct_drafts"] or 0 for row in rows) > 0  # some drafts accepted

    info = get(ngram_server.url, "/server_info")
    (manifest,) = (tmp_path / "journals-ngram").glob("sets/*/manifest.json")
    drafter = json.loads(manifest.read_text())["target"]["drafter"]
    settings = {key: info[key] for key in DRAFTER_SETTING_KEYS if info.get(key) is not None}
    assert "speculative_ngram_max_bfs_breadth" in settings  # what an NGRAM drafter proposes is its own
    assert drafter == {**{key: info[key] for key in DRAFTER_KEYS}, **settings}
    assert drafter["speculative_algorithm"] == "NGRAM" and drafter["speculative_num_draft_tokens"] == 12

    # speculation leaves greedy outputs as they are: the same token rows from the plain server
    plain_recipe = write_recipe(tmp_path, endpoints=[real_server.url], model=model, sampling=SAMPLING)
    plain = _load(plain_recipe, tmp_path, "plain")
    assert [(r["id"], r["input_ids"]) for r in plain] == [(r["id"], r["input_ids"]) for r in rows]
    assert all(r["meta"][name] is None for r in plain for name in SPEC_FIELDS)


def _eagle3_draft(folder: Path) -> Path:
    """A one-layer EAGLE3 draft model folder (``LlamaForCausalLMEagle3``, SGLang's
    ``models/llama_eagle3.py``) sized to the reference model (hidden size, heads, vocabulary);
    random weights (``--load-format dummy``)."""
    config = json.loads((reference_model_dir() / "config.json").read_text())
    config.update(
        architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1,
        draft_vocab_size=config["vocab_size"], target_hidden_size=config["hidden_size"],
        tie_word_embeddings=False,
    )  # fmt: skip
    folder.mkdir()
    for name in MODEL_FILES:
        shutil.copyfile(reference_model_dir() / name, folder / name)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def test_eagle3_does_not_start_on_this_cpu_its_draft_model_has_no_attention_backend(
    tmp_path: Path, real_venv: Path, real_logs: Path
) -> None:
    """What the README says the EAGLE family does here, as SGLang says it: the target (SGLang's
    own Qwen3 class on the reference model's config, random weights) and the draft load, then
    the draft's multi-step decode backend is refused (EAGLE and STANDALONE stop at the same line;
    with one draft step, the draft-extend backend is refused the same way)."""
    target = tmp_path / "qwen3"
    shutil.copytree(reference_model_dir(), target)
    draft = _eagle3_draft(tmp_path / "eagle3-draft")
    flags = (
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4",
    )  # fmt: skip
    with (
        pytest.raises(RuntimeError, match="exited with code") as failed,
        launch_real(target, *flags, log_dir=real_logs / "eagle3"),
    ):
        pass
    tail = str(failed.value)
    assert "ValueError: EAGLE is not supported in decode attention backend torch_native" in tail, tail[-2000:]
