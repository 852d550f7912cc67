"""Run inside the Model-Optimizer 0.47.0 environment by ``scripts/prove_trainers.py``; prints one JSON line.

Model-Optimizer's own loader of the draft vocabulary cache (``data.draft_vocab_cache``,
``modelopt/torch/speculative/plugins/hf_eagle.py:318-338``) on our ``d2t-N.pt``, into a buffer made
as its EAGLE module makes it (int64, ``modeling_eagle.py:51``). Argument: a JSON file with ``d2t``,
``size`` and ``vocab_size``.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import torch
from modelopt.torch.speculative.plugins.hf_eagle import HFEagleModel


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    module = SimpleNamespace(d2t=torch.zeros(config["size"], dtype=torch.int64))
    model = SimpleNamespace(
        eagle_config=SimpleNamespace(draft_vocab_size=config["size"], vocab_size=config["vocab_size"]),
        eagle_module=module,
    )
    HFEagleModel.load_draft_vocab_cache(model, config["d2t"])
    ids = module.d2t + torch.arange(config["size"])
    result = {
        "versions": {"nvidia-modelopt": version("nvidia-modelopt"), "torch": torch.__version__},
        "loaded": bool(module.d2t.any()),
        "ids_ascending_in_vocab": bool((ids[1:] > ids[:-1]).all() and ids[-1] < config["vocab_size"]),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
