"""The start-up checks on the real SGLang: what ``/model_info``, ``/server_info`` and ``/v1/models``
say is read as the target (the batch size from the schedulers' ``internal_states``, which sizes
the requests in flight), the tokenizer probe passes for the model's own tokenizer and refuses
another one before any ``/generate``. (A ``--preferred-sampling-params`` that would fill a key is
refused in ``test_launch.py``, on a server started with it.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

import eagle3_raw
from eagle3_raw.errors import ServerMismatch
from eagle3_raw.run.build import _default_in_flight
from eagle3_raw.sglang import client as sglang
from tests.helpers import write_prompts, write_recipe
from tests.real_sglang.conftest import MAX_RUNNING
from tests.real_sglang.server import RealSGLang, get
from tests.support import tokenizers


async def _identity(url: str) -> sglang.ServerIdentity:
    async with sglang.new_session(connect_timeout=10, api_key=None) as session:
        return await sglang.server_identity(session, url, 60)


def test_the_start_up_checks_read_the_real_server_and_size_the_requests_in_flight_from_its_schedulers(
    tmp_path: Path, real_server: RealSGLang, real_model: Path
) -> None:
    identity = asyncio.run(_identity(real_server.url))
    info = get(real_server.url, "/server_info")
    (state,) = info["internal_states"]
    assert info["max_running_requests"] == MAX_RUNNING  # as passed; null when it is not
    assert identity.max_running_requests == state["effective_max_running_requests_per_dp"] > 0
    assert _default_in_flight([identity]) == int(identity.max_running_requests * 1.25) + 8
    assert (identity.version, identity.model_path) == ("0.5.23", str(real_model))
    assert identity.context_length == get(real_server.url, "/v1/models")["data"][0]["max_model_len"] == 4096
    assert identity.max_req_input_len == info["max_req_input_len"] and identity.reserved_tokens == 0

    write_prompts(tmp_path, 3)
    model = {"tokenizer": str(real_model), "render": "local"}  # the render check runs too
    recipe = write_recipe(tmp_path, endpoints=[real_server.url], model=model, sampling={"max_new_tokens": 8})
    rows = eagle3_raw.load(
        str(recipe), cache_dir=str(tmp_path / "c"), journal_dir=tmp_path / "j", progress="none"
    )
    assert len(rows) == 3
    manifest = orjson.loads(next((tmp_path / "j").glob("sets/*/manifest.json")).read_bytes())
    recorded = manifest["server"]["server_info"]
    assert (recorded["version"], recorded["reasoning_parser"], recorded["tool_call_parser"]) == (
        "0.5.23", "qwen3", "qwen",  # SGLang reports the deprecated qwen25 as qwen
    )  # fmt: skip


def test_a_recipe_naming_another_tokenizer_is_refused_by_the_real_servers_tokenize(
    tmp_path: Path, real_server: RealSGLang
) -> None:
    source = write_prompts(tmp_path, 3)
    source.write_text(source.read_text().replace('"id":"p', '"id":"other-tok-p'))
    model = {"tokenizer": str(tokenizers.tokenizer_folder("qwen3"))}  # the real server runs the reference one
    recipe = write_recipe(tmp_path, endpoints=[real_server.url], model=model, sampling={"max_new_tokens": 8})
    with pytest.raises(ServerMismatch) as refused:
        eagle3_raw.load(
            str(recipe), cache_dir=str(tmp_path / "c"), journal_dir=tmp_path / "j", progress="none"
        )
    assert f"the server at {real_server.url} tokenizes differently from model.tokenizer=" in str(
        refused.value
    )
    assert not [rid for rid in real_server.received_rids() if rid.startswith("other-tok-")]  # no /generate
