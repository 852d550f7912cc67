"""What the server reports about itself in vLLM mode: ``/health`` (no generation), ``/version``,
``/v1/models`` (``ModelList``), and in dev mode (``VLLM_SERVER_DEV_MODE=1`` in the server's
environment, read at start) ``/server_info?config_format=json``, ``/weight_info`` and
``POST /reset_prefix_cache``; plus
``POST /inference/v1/abort_requests``. The reference's own ``/reference/stats`` stay the SGLang
mode's (:class:`eagle3_raw.reference.server.info.Info`).
"""

from __future__ import annotations

import os
from typing import Any

import orjson
from aiohttp import web

from eagle3_raw.reference.server.replies import json_response
from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.reference.vllmapi.errors import VLLMError, error_reply, invalid_body
from eagle3_raw.reference.vllmapi.options import VLLMOptions

DEV_MODE = "VLLM_SERVER_DEV_MODE"
_REPORTED_ENV = ("VLLM_SERVER_DEV_MODE", "VLLM_API_KEY", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK",
                 "VLLM_TARGET_DEVICE", "VLLM_CPU_KVCACHE_SPACE")  # fmt: skip


def dev_mode() -> bool:
    """vLLM's ``envs.VLLM_SERVER_DEV_MODE``: set to ``1`` (or ``true``) in the server's environment."""
    return os.environ.get(DEV_MODE, "0").strip().lower() in ("1", "true")


class VLLMInfo:
    """The reporting routes over the shared :class:`ServerState`."""

    def __init__(self, state: ServerState) -> None:
        assert state.config.vllm is not None
        self.state = state
        self.options: VLLMOptions = state.config.vllm

    async def health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.StreamResponse:
        return json_response({"version": self.options.version})

    async def models(self, request: web.Request) -> web.StreamResponse:
        return json_response(self.models_dict())

    def models_dict(self) -> dict[str, Any]:
        s = self.state
        created = int(s.started)
        permission = {
            "id": f"modelperm-{s.served_model_name}", "object": "model_permission", "created": created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
            "organization": "*", "group": None, "is_blocking": False,
        }  # fmt: skip
        card = {
            "id": s.served_model_name, "object": "model", "created": created, "owned_by": "vllm",
            "root": s.model.reported_path, "parent": None, "max_model_len": s.model.context_len,
            "permission": [permission],
        }  # fmt: skip
        return {"object": "list", "data": [card]}

    async def server_info(self, request: web.Request) -> web.StreamResponse:
        return json_response(self.server_info_dict())

    def server_info_dict(self) -> dict[str, Any]:
        """``/server_info?config_format=json``: the ``vllm_config`` parts a client reads."""
        s, c, o = self.state, self.state.config, self.options
        model_config = {
            "model": s.model.reported_path, "tokenizer": s.model.reported_path,
            "tokenizer_mode": o.tokenizer_mode, "trust_remote_code": c.trust_remote_code,
            "dtype": o.dtype, "seed": o.seed, "revision": c.revision, "tokenizer_revision": None,
            "max_model_len": s.model.context_len, "served_model_name": s.served_model_name,
            "skip_tokenizer_init": c.skip_tokenizer_init, "generation_config": o.generation_config,
            "override_generation_config": {}, "quantization": None, "hf_token": None,
        }  # fmt: skip
        vllm_config = {
            "model_config": model_config,
            "scheduler_config": {"max_num_seqs": o.max_num_seqs or c.slots or 256},
            "parallel_config": {"tensor_parallel_size": c.tp_size, "data_parallel_size": c.dp_size},
            "structured_outputs_config": {"reasoning_parser": c.reasoning_parser or ""},
            "speculative_config": None,
        }
        env = {
            name: os.environ[name] for name in _REPORTED_ENV if name in os.environ and name != "VLLM_API_KEY"
        }
        return {"vllm_config": vllm_config, "vllm_env": env, "system_env": {}}

    async def reset_prefix_cache(self, request: web.Request) -> web.StreamResponse:
        """Dev mode's ``POST /reset_prefix_cache``: empties the prefix cache; 200, empty body."""
        if self.state.cache is not None:
            self.state.cache.clear()
        return web.Response(status=200)

    async def weight_info(self, request: web.Request) -> web.StreamResponse:
        return json_response({"weight_version": self.state.model.weight_version})

    async def abort_requests(self, request: web.Request) -> web.StreamResponse:
        """``{"request_ids": [...]}``: each engine id in flight is aborted; 200 with an empty body."""
        try:
            body = orjson.loads(await request.read() or b"{}")
        except orjson.JSONDecodeError:
            return error_reply(VLLMError("Expecting value: the body is not JSON"))
        ids = body.get("request_ids") if isinstance(body, dict) else None
        if ids is None:  # the route's own check (scale_out/token_in_token_out/api_router.py)
            return error_reply(VLLMError("Missing 'request_ids' in request body", kind="Bad Request"))
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return error_reply(
                invalid_body(
                    "request_ids", "Field required" if ids is None else "Input should be a list of strings"
                )
            )
        for rid in ids:
            ticket = self.state.inflight.get(rid)
            if ticket is None:
                continue
            if self.state.slots is not None:
                self.state.slots.abort(ticket)
            else:
                ticket.aborted.set()
        return web.Response(status=200)
