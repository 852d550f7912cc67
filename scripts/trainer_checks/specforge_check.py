"""Run inside the SpecForge 0.2.0 environment by ``scripts/prove_trainers.py``; prints one JSON line.

Argument: a JSON file with ``cases`` (name -> {"file": a JSONL export, "max_length": N, "expect":
JSONL of the (input_ids, loss_mask) rows SpecForge must end up with, in order}), ``mapping`` (a
``vocab_mapping-N.pt``), ``token_freq`` (our ``token_freq.pt``), ``size``, ``vocab_size`` and
``config`` (an online config naming the mapping, for building the draft as training does).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from specforge.algorithms.builtin import builtin_algorithm_registry
from specforge.algorithms.model_providers import build_eagle3_draft
from specforge.config import load_config
from specforge.core.compact_teacher import validate_vocab_mapping_consistency
from specforge.data.preprocessing import process_token_dict_to_mappings
from specforge.data.prompt_builder import prepare_prompt_tasks
from specforge.training.model_loading import resolve_draft_config


def expected(path: Path) -> list[tuple[list[int], list[int]]]:
    return [(r["input_ids"], r["loss_mask"]) for r in map(json.loads, path.read_text().splitlines())]


def check_case(case: dict[str, Any]) -> dict[str, Any]:
    """SpecForge's pre-tokenized reader (``specforge/data/prompt_builder.py:20-98``), EAGLE-3's minimum."""
    tasks = prepare_prompt_tasks(
        case["file"],
        None,
        chat_template=None,
        max_length=case["max_length"],
        is_preformatted=False,
        train_only_last_turn=False,
        cache_dir=None,
        cache_key=None,
        num_proc=None,
        min_loss_tokens=1,
    )
    got = [(t["payload"]["input_ids"], t["payload"]["loss_mask"]) for t in tasks]
    want = expected(Path(case["expect"]))
    return {"rows": len(got), "expected": len(want), "identical": got == want}


def check_mapping(config: dict[str, Any]) -> dict[str, Any]:
    mapping = torch.load(config["mapping"])  # as SpecForge loads it (specforge/modeling/draft/base.py:203)
    d2t, t2d = mapping["d2t"], mapping["t2d"]
    validate_vocab_mapping_consistency(t2d, d2t)  # raises when nonzero(t2d) != d2t + arange
    counts = Counter(torch.load(config["token_freq"], weights_only=True))
    own_d2t, own_t2d = process_token_dict_to_mappings(counts, config["size"], config["vocab_size"])
    return {
        "dtypes": [str(d2t.dtype), str(t2d.dtype)],
        "shapes": [list(d2t.shape), list(t2d.shape)],
        "consistency_check": "passed",
        "equal_to_specforge_own_mapping": bool(torch.equal(own_d2t, d2t) and torch.equal(own_t2d, t2d)),
        "ids_differing_from_specforge_own": int((own_t2d != t2d).sum()),
    }


def check_draft(config: dict[str, Any]) -> dict[str, Any]:
    """Build the EAGLE-3 draft the way training does; it loads ``model.vocab_mapping_path``."""
    cfg = load_config(config["config"])
    algorithm = builtin_algorithm_registry().resolve("eagle3")
    draft_config = resolve_draft_config(cfg, provider=algorithm.providers.model.draft_config)
    draft = build_eagle3_draft(cfg, draft_config)
    mapping = torch.load(config["mapping"])
    validate_vocab_mapping_consistency(draft.t2d, draft.d2t)
    return {
        "draft": type(draft).__name__,
        "loaded": bool(draft.vocab_mapping_loaded),
        "buffers_equal_file": bool(
            torch.equal(draft.d2t, mapping["d2t"]) and torch.equal(draft.t2d, mapping["t2d"])
        ),
    }


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    result = {
        "versions": {
            "specforge": _version("specforge"),
            "torch": torch.__version__,
            "transformers": _version("transformers"),
        },
        "cases": {name: check_case(case) for name, case in config["cases"].items()},
        "mapping": check_mapping(config),
        "draft": check_draft(config),
    }
    print(json.dumps(result))


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main()
