"""An SGLang plugin (entry point group ``sglang.srt.plugins``) so that
``--enable-deterministic-inference`` starts on the CPU engine, as the recipes' launch asks.

SGLang loads it in every server process (``sglang/srt/plugins/__init__.py::load_plugins``, called
by ``launch_server``, the scheduler and the detokenizer) before the server arguments are checked.
The entry point is declared by ``../eagle3_raw_sglang_cpu-0.1.0.dist-info``, found on the
server's ``PYTHONPATH``.

- ``sglang/srt/arg_groups/overrides.py::_deterministic_attention_backend`` refuses the flag unless
  the attention backend is one of a GPU list; ``torch_native`` (the one the CPU runs) is added to
  it with SGLang's own ``add_deterministic_attention_backend_choices``.
- ``ModelRunner.maybe_enable_batch_invariant_mode`` (``sglang/srt/model_executor/model_runner.py``)
  then switches on the batch-invariant mode, whose kernels are Triton GPU kernels: it is switched
  off here (``enable_batch_invariant_mode`` made a no-op). What this leaves untested is said in
  the README: the batch-invariant kernels need a GPU.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def _batch_invariant_mode_off() -> None:
    logger.info("eagle3_raw CPU plugin: batch-invariant mode (Triton GPU kernels) left off")


def register() -> None:
    from sglang.srt.arg_groups.choices import (
        DETERMINISTIC_ATTENTION_BACKEND_CHOICES,
        add_deterministic_attention_backend_choices,
    )
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if "torch_native" not in DETERMINISTIC_ATTENTION_BACKEND_CHOICES:
        add_deterministic_attention_backend_choices(["torch_native"])
    HookRegistry.register(
        "sglang.srt.batch_invariant_ops.enable_batch_invariant_mode",
        _batch_invariant_mode_off,
        HookType.REPLACE,
    )
