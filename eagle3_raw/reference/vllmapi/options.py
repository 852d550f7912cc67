"""``VLLMOptions``: what ``--protocol vllm`` adds to the server's configuration (vLLM's own flags
that have no SGLang counterpart; the shared ones map onto
:class:`~eagle3_raw.reference.server.ServerConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

TOOL_CALL_PARSERS = ("hermes", "qwen3_json")
"""vLLM 0.33's tool-call parsers for Qwen3-style ``<tool_call>`` JSON that the reference implements
(``qwen3_json`` is an alias of ``hermes`` in 0.33's ``tool_parsers/__init__.py``)."""
REASONING_PARSERS = ("qwen3", "deepseek_r1")
"""vLLM 0.33's ``<think>`` reasoning parsers that the reference implements."""


@dataclass(frozen=True)
class VLLMOptions:
    """The vLLM-only settings: reported (``/version``, ``/server_info``) or deciding a route's answer."""

    version: str = "0.32.0"
    enable_scale_out: bool = False
    enable_auto_tool_choice: bool = False
    max_num_seqs: int | None = None
    seed: int = 0
    dtype: str = "auto"
    generation_config: str = "auto"
    tokenizer_mode: str = "auto"

    def __post_init__(self) -> None:
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"--max-num-seqs must be at least 1, got {self.max_num_seqs}")


def check_parsers(reasoning: str | None, tool_call: str | None, auto_tool_choice: bool) -> None:
    """ValueError for parser flags the reference cannot honour, or that vLLM itself refuses."""
    if reasoning is not None and reasoning not in REASONING_PARSERS:
        raise ValueError(
            f"--reasoning-parser {reasoning!r}: the reference implements {', '.join(REASONING_PARSERS)}"
        )
    if tool_call is not None and tool_call not in TOOL_CALL_PARSERS:
        raise ValueError(
            f"--tool-call-parser {tool_call!r}: the reference implements {', '.join(TOOL_CALL_PARSERS)}"
        )
    if auto_tool_choice and tool_call is None:
        raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")
