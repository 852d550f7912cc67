"""What SGLang 0.5.23 reports about the model it serves (``/model_info`` and ``/server_info``)."""

TARGET_KEYS = ("model_path", "served_model_name", "weight_version", "version")
"""The facts that decide a server's outputs: a generation made by another model, weights or SGLang
version is another one."""
