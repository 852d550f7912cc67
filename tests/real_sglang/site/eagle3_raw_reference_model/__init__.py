"""The out-of-tree model package the real SGLang loads in the tests (``SGLANG_EXTERNAL_MODEL_PACKAGE``):
SGLang registers the ``EntryClass`` of each module in it (``sglang/srt/models/registry.py``)."""
