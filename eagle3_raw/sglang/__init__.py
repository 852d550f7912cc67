"""SGLang 0.5.23, in one place: everything eagle3_raw knows and assumes about the engine.

- :mod:`~eagle3_raw.sglang.protocol`: the request and response fields, sampling keys and defaults,
  the contract a server's answers are checked against;
- :mod:`~eagle3_raw.sglang.client`: the client of the native ``/generate``, ``/tokenize`` and the
  identity routes; :mod:`~eagle3_raw.sglang.responses` the checks a response passes;
  :mod:`~eagle3_raw.sglang.engine` all of it as the run's :class:`~eagle3_raw.serving.Engine`;
- :mod:`~eagle3_raw.sglang.chatpath`, :mod:`~eagle3_raw.sglang.chatrequest`,
  :mod:`~eagle3_raw.sglang.chatschema`: its chat path as a library (messages to prompt ids);
- :mod:`~eagle3_raw.sglang.parsers`: its reasoning and tool-call output parsers;
- :mod:`~eagle3_raw.sglang.sampling`: its ``sampling_params`` defaults and keys;
- :mod:`~eagle3_raw.sglang.launch`: its launch command and the flags eagle3_raw manages.

An SGLang upgrade changes this package; a second engine implements the same boundary.
"""
