"""The SGLang-compatible reference server and its tiny model (for tests, demos and benchmarks); with
``--protocol vllm`` it speaks vLLM's token-exact API instead (:mod:`eagle3_raw.reference.vllmapi`)."""

READY = "reference server ready at "
"""The line the server prints once it answers; a launcher waits for it in the server's log."""
