"""What SGLang 0.5.23 reports about the model it serves (``/model_info`` and ``/server_info``)."""

from eagle3_raw.sglang.protocol.outputs import NGRAM_DEFAULTS

TARGET_KEYS = ("model_path", "served_model_name", "weight_version", "version")
"""The facts that decide a server's outputs: a generation made by another model, weights or SGLang
version is another one."""

DRAFTER_KEYS = (
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_draft_model_revision",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)
"""The ``/server_info`` keys that say which drafter a speculating server runs: its acceptance
figures (``meta_info``'s ``spec_*``) are that drafter's, so a set records them with its target."""

DRAFTER_SETTING_KEYS = tuple(NGRAM_DEFAULTS)
"""Further ``/server_info`` keys that decide what an NGRAM drafter proposes (it has no draft model):
part of an NGRAM server's drafter. SGLang 0.5.23 reports them whatever the algorithm, with its
defaults (:data:`~eagle3_raw.sglang.protocol.outputs.NGRAM_DEFAULTS`)."""
