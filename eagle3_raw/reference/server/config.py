"""``ServerConfig``: everything ``eagle3-raw serve-reference`` can set, frozen and validated in one place."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_raw.reference.capacity import Timing
from eagle3_raw.reference.faults import FaultSpec
from eagle3_raw.reference.speculation import Drafter
from eagle3_raw.reference.vllmapi.options import VLLMOptions, check_parsers
from eagle3_raw.sglang.parsers import REASONING_PARSER_NAMES, TOOL_CALL_PARSER_NAMES

DEPRECATED_TOOL_CALL_PARSERS: Mapping[str, str] = {"qwen25": "qwen", "glm45": "glm"}
"""SGLang 0.5.23 accepts these names and reports (and runs) the ones they map to."""


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``eagle3-raw serve-reference`` can set; validated here, in one place."""

    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    model_path: Path | None = None
    served_model_name: str | None = None
    weight_version: str = "default"
    context_length: int | None = None
    skip_tokenizer_init: bool = False
    max_running_requests: int | None = None
    max_queued_requests: int | None = None
    disable_radix_cache: bool = False
    stream_interval: int = 1
    faults: FaultSpec | None = None
    slots: int | None = None
    timing: Timing | None = None
    ledger: Path | None = None
    launch_command: str = ""
    preferred_sampling_params: Mapping[str, Any] = field(default_factory=dict)
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_draft_model_path: str | None = None
    speculative_draft_model_revision: str | None = None
    draft_acceptance: float = 0.7
    chat_template: Path | None = None
    trust_remote_code: bool = False
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    tp_size: int = 1
    dp_size: int = 1
    revision: str | None = None
    vllm: VLLMOptions | None = None
    """Set by ``--protocol vllm``: the server answers vLLM's routes instead of SGLang's."""

    @property
    def protocol(self) -> str:
        """``"vllm"`` or ``"sglang"``: whose HTTP API the server speaks."""
        return "sglang" if self.vllm is None else "vllm"

    @property
    def reported_tool_call_parser(self) -> str | None:
        """``--tool-call-parser`` as SGLang reports it: a deprecated name resolved to the one it
        stands for (``qwen25`` -> ``qwen``, ``glm45`` -> ``glm``;
        ``sglang/srt/arg_groups/serving_hook.py::handle_deprecated_args``)."""
        name = self.tool_call_parser
        return DEPRECATED_TOOL_CALL_PARSERS.get(name, name) if name is not None else None

    @property
    def reserved_tokens(self) -> int:
        """Output slots reserved per request (SGLang's ``compute_num_reserved_tokens``): only EAGLE
        algorithms reserve, max(topk x steps, draft tokens); the reference only reports and counts them."""
        if (self.speculative_algorithm or "").upper() not in ("EAGLE", "EAGLE3", "NEXTN"):
            return 0
        topk, steps = self.speculative_eagle_topk or 0, self.speculative_num_steps or 0
        return max(topk * steps, self.speculative_num_draft_tokens or 0)

    @property
    def drafter(self) -> Drafter | None:
        """The simulated drafter behind ``--speculative-algorithm`` (None without one): its draft
        tokens per step are ``--speculative-num-draft-tokens``, else SGLang's default, steps + 1."""
        if self.speculative_algorithm is None:
            return None
        draft_tokens = self.speculative_num_draft_tokens or (self.speculative_num_steps or 0) + 1
        return Drafter(draft_tokens, self.draft_acceptance)

    def __post_init__(self) -> None:
        if (self.slots is None) != (self.timing is None):
            raise ValueError("--slots and --ms-per-token go together (capacity mode needs both)")
        if self.slots is not None and self.slots < 1:
            raise ValueError(f"--slots must be at least 1, got {self.slots}")
        if self.timing is not None and min(self.timing.ms_per_token, self.timing.prefill_ms_per_token) < 0:
            raise ValueError("--ms-per-token and --prefill-ms-per-token must be >= 0")
        if self.context_length is not None and self.context_length < 8:
            raise ValueError(f"--context-length must be at least 8, got {self.context_length}")
        if min(self.tp_size, self.dp_size) < 1:
            raise ValueError(
                f"--tp-size and --dp-size must be at least 1, got {self.tp_size}, {self.dp_size}"
            )
        if self.stream_interval < 1:
            raise ValueError(f"--stream-interval must be at least 1, got {self.stream_interval}")
        if self.speculative_algorithm is not None and self.reserved_tokens < 1:
            raise ValueError(
                "--speculative-algorithm EAGLE/EAGLE3 needs --speculative-num-steps and "
                "--speculative-eagle-topk, or --speculative-num-draft-tokens"
            )
        if self.speculative_algorithm is not None:
            self.drafter  # noqa: B018 (raises ValueError naming the bad option)
        elif self.speculative_draft_model_path is not None:
            raise ValueError("--speculative-draft-model-path needs --speculative-algorithm")
        if self.vllm is not None:
            check_parsers(self.reasoning_parser, self.tool_call_parser, self.vllm.enable_auto_tool_choice)
        else:
            _check_parser("--reasoning-parser", self.reasoning_parser, REASONING_PARSER_NAMES)
            _check_parser("--tool-call-parser", self.tool_call_parser, TOOL_CALL_PARSER_NAMES)
        if self.max_queued_requests is not None and self.slots is None:
            raise ValueError("--max-queued-requests needs capacity mode (--slots, --ms-per-token)")


def _check_parser(option: str, name: str | None, names: tuple[str, ...]) -> None:
    """SGLang's choices for the parser flags (``server_args``)."""
    if name is not None and name not in names:
        raise ValueError(f"{option}: unknown parser {name!r}; SGLang 0.5.23 has {', '.join(names)}")
