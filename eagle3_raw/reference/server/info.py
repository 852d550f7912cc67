"""What the server reports about itself: ``/health`` (``/health_generate``), ``/model_info``
(``/get_model_info``), ``/server_info`` (``/get_server_info``), ``/v1/models`` and ``/v1/loads``
(``shared/sglang-protocol.md`` §6), and the reference's own ``GET /reference/stats`` with its
``POST /reference/stats/reset``.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from eagle3_raw.reference.capacity import Counters
from eagle3_raw.reference.engine import EngineParams
from eagle3_raw.reference.server.replies import json_response
from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.sglang import protocol as p

VERSION = "0.5.23"


class Info:
    """The reporting endpoints over the shared :class:`ServerState`."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def health(self, request: web.Request) -> web.StreamResponse:
        """``/health`` and ``/health_generate``: a one-token greedy generation from ``[0]``."""
        self.state.model.engine.generate([0], EngineParams(max_new_tokens=1, temperature=0.0))
        return web.Response(status=200)

    async def model_info(self, request: web.Request) -> web.StreamResponse:
        return json_response(self.model_info_dict())

    def model_info_dict(self) -> dict[str, Any]:
        model = self.state.model
        return {
            "model_path": model.reported_path,
            "served_model_name": self.state.served_model_name,
            "tokenizer_path": model.reported_path,
            "is_generation": True,
            "preferred_sampling_params": dict(self.state.config.preferred_sampling_params) or None,
            "weight_version": model.weight_version,
            "load_format": "auto",
            "reasoning_parser": self.state.config.reasoning_parser,
            "tool_call_parser": self.state.config.reported_tool_call_parser,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": model.config.get("model_type"),
            "architectures": model.config.get("architectures"),
        }

    async def server_info(self, request: web.Request) -> web.StreamResponse:
        return json_response(self.server_info_dict())

    def server_info_dict(self) -> dict[str, Any]:
        """Every server argument (``context_length`` null unless passed), scheduler facts, version."""
        s, c = self.state, self.state.config
        return {
            "model_path": s.model.reported_path, "tokenizer_path": s.model.reported_path,
            "tokenizer_mode": "auto", "skip_tokenizer_init": c.skip_tokenizer_init, "load_format": "auto",
            "trust_remote_code": c.trust_remote_code, "context_length": c.context_length,
            "is_embedding": False, "revision": c.revision, "host": c.host, "port": c.port,
            "served_model_name": s.served_model_name,
            "weight_version": c.weight_version,
            "dtype": "auto", "quantization": None, "device": "cpu", "api_key": "***" if c.api_key else None,
            "max_running_requests": c.max_running_requests, "max_queued_requests": c.max_queued_requests,
            "max_total_tokens": None, "chunked_prefill_size": 8192, "max_prefill_tokens": 16384,
            "schedule_policy": "fcfs", "tp_size": c.tp_size, "dp_size": c.dp_size, "pp_size": 1,
            "stream_interval": c.stream_interval, "incremental_streaming_output": False,
            "random_seed": None, "enable_deterministic_inference": True, "allow_auto_truncate": False,
            "disable_radix_cache": c.disable_radix_cache, "enable_return_hidden_states": False,
            "enable_custom_logit_processor": False,
            "preferred_sampling_params": dict(c.preferred_sampling_params) or None,
            "chat_template": str(c.chat_template) if c.chat_template else None,
            "reasoning_parser": c.reasoning_parser, "tool_call_parser": c.reported_tool_call_parser,
            **self._speculative(), **self._ngram(),
            "sampling_defaults": "model", "launch_command": c.launch_command, "status": "ready",
            "max_total_num_tokens": s.max_total_num_tokens,
            "max_req_input_len": s.limits.max_req_input_len,
            "startup_time": s.started, "kv_events": None, "internal_states": [self._internal_state()],
            "version": VERSION, "frontend": "python", "reference": self._reference_info(),
        }  # fmt: skip

    def _speculative(self) -> dict[str, Any]:
        c = self.state.config
        return {
            "speculative_algorithm": c.speculative_algorithm,
            "speculative_draft_model_path": c.speculative_draft_model_path,
            "speculative_draft_model_revision": c.speculative_draft_model_revision,
            "speculative_num_steps": c.speculative_num_steps,
            "speculative_eagle_topk": c.speculative_eagle_topk,
            "speculative_num_draft_tokens": c.speculative_num_draft_tokens,
        }  # fmt: skip

    @staticmethod
    def _ngram() -> dict[str, Any]:
        """SGLang reports its NGRAM settings whatever the algorithm (the reference has no NGRAM)."""
        return dict(p.NGRAM_DEFAULTS)

    def _internal_state(self) -> dict[str, Any]:
        return {
            **self._speculative(),
            "effective_max_running_requests_per_dp": self.state.max_running_requests,
            "last_gen_throughput": 0.0,
            "#running-req": self.state.running,
            "#queue-req": self.state.waiting,
            "memory_usage": {},
        }

    def _reference_info(self) -> dict[str, Any]:
        c = self.state.config
        return {
            "faults": dict(c.faults.rates) if c.faults else None,
            "fault_seed": c.faults.seed if c.faults else None,
            "slots": c.slots,
            "ms_per_token": c.timing.ms_per_token if c.timing else None,
            "prefill_ms_per_token": c.timing.prefill_ms_per_token if c.timing else None,
            "ledger": str(c.ledger) if c.ledger else None,
        }

    async def models(self, request: web.Request) -> web.StreamResponse:
        name = self.state.served_model_name
        card = {
            "id": name, "object": "model", "created": int(self.state.started), "owned_by": "sglang",
            "root": name, "parent": None, "max_model_len": self.state.model.context_len,
        }  # fmt: skip
        return json_response({"object": "list", "data": [card]})

    async def loads(self, request: web.Request) -> web.StreamResponse:
        s = self.state
        load = {
            "timestamp": time.time(), "dp_rank": 0, "num_running_reqs": s.running,
            "num_waiting_reqs": s.waiting, "max_total_num_tokens": s.max_total_num_tokens,
            "max_running_requests": s.max_running_requests,
            "utilization": s.running / s.slots.slots if s.slots else 0.0,
        }  # fmt: skip
        return json_response(
            {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "version": VERSION,
             "accelerator": None, "num_accelerators": 1, "loads": [load]}
        )  # fmt: skip

    async def stats(self, request: web.Request) -> web.StreamResponse:
        """``GET /reference/stats``: slots, busy-slot seconds, wall seconds, counters, faults."""
        return json_response(self.state.counters.snapshot(self.state.slots, self.state.config.timing))

    async def reset_stats(self, request: web.Request) -> web.StreamResponse:
        """``POST /reference/stats/reset``: zero the counters and the busy-slot accounting."""
        self.state.counters = Counters()
        if self.state.slots is not None:
            self.state.slots.reset_accounting()
        return await self.stats(request)
