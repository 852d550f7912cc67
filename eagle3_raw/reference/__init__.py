"""The SGLang-compatible reference server and its tiny model (for tests, demos and benchmarks)."""
