"""vLLM, in one place: everything eagle3_raw knows and assumes about the second engine.

- :mod:`~eagle3_raw.vllm.client`: the client of ``/v1/completions`` (id prompts,
  ``return_token_ids``), ``/tokenize``, ``/detokenize``, the derender route and the identity
  routes; :mod:`~eagle3_raw.vllm.responses` the checks a completion passes;
- :mod:`~eagle3_raw.vllm.sampling`: vLLM's ``SamplingParams`` as eagle3_raw sends them (the
  recipe's keys in vLLM's names, every default sent);
- :mod:`~eagle3_raw.vllm.launch`: its launch command and the flags eagle3_raw manages.

What the real vLLM answers is in ``docs/vllm-protocol.md``. A vLLM upgrade changes this package;
it implements the boundary :mod:`eagle3_raw.engines` names, as :mod:`eagle3_raw.sglang` does.
"""
