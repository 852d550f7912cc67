"""The reference server's vLLM mode (``--protocol vllm``): vLLM 0.33's token-exact HTTP API over the
same reference engine, model, parsers, faults, ledger and capacity mode as the SGLang mode.

Held to ``docs/vllm-protocol.md`` (what the real vLLM answers, asserted on the real server by
``tests/real_vllm``) and checked against vLLM 0.33's own pydantic models by
``tests/real_vllm/test_reference_contract.py``:

- :mod:`.options` the vLLM-only settings, :mod:`.errors` vLLM's ``ErrorResponse`` and messages;
- generation: :mod:`.requests` (``/v1/completions`` and ``/inference/v1/generate`` bodies),
  :mod:`.sampling` (``SamplingParams``), :mod:`.plan` (the engine, capacity timing, aborts),
  :mod:`.replies` (the response bodies), :mod:`.generation` (the handlers, faults, ledger lines);
- :mod:`.info` (health, version, models, dev-mode server info, abort), :mod:`.tokens` and
  :mod:`.chat` (``/tokenize``, ``/detokenize``), :mod:`.render`, :mod:`.derender`;
- :mod:`.app`: routes and middleware.
"""
