"""The reference model's folder (shipped in the package) and loading its tokenizer.

Token ids of the packaged tokenizer (6144 ids, no BOS; all other ids are byte-level BPE):
``<|endoftext|>`` 6137 (pad), ``<|im_start|>`` 6138, ``<|im_end|>`` 6139 (EOS), and the added
tokens that decoding keeps even with ``skip_special_tokens`` (as in Qwen3): ``<think>`` 6140,
``</think>`` 6141, ``<tool_call>`` 6142, ``</tool_call>`` 6143.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tokenizers
    from transformers import PreTrainedTokenizerBase

_MODEL_DIR = Path(__file__).resolve().parent / "model"


def reference_model_dir() -> Path:
    """The reference server's tiny model: tokenizer files, chat template, config."""
    return _MODEL_DIR


def load_tokenizer(
    model_dir: Path | None = None, *, trust_remote_code: bool = False
) -> PreTrainedTokenizerBase:
    """The ``transformers`` tokenizer with the chat template, loaded offline (imports transformers);
    ``trust_remote_code`` runs a folder's own tokenizer code (``--trust-remote-code``)."""
    from transformers import AutoTokenizer

    path = model_dir or reference_model_dir()
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
        str(path), local_files_only=True, trust_remote_code=trust_remote_code
    )
    return tokenizer


def load_raw_tokenizer(model_dir: Path | None = None) -> tokenizers.Tokenizer:
    """The bare ``tokenizers`` tokenizer: fast to load, no chat template."""
    import tokenizers

    return tokenizers.Tokenizer.from_file(str((model_dir or reference_model_dir()) / "tokenizer.json"))
