"""The SGLang-compatible reference server and its tiny model (for tests, demos and benchmarks)."""

READY = "reference server ready at "
"""The line the server prints once it answers; a launcher waits for it in the server's log."""
