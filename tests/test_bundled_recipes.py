"""The ready recipes in builder_scripts/ (issue 11): each one valid, and each one building against a
reference server that renders and generates with that model family's real tokenizer (npm, cached)
instead of the Hub model it names (this machine reaches no Hub)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import eagle3_raw
from eagle3_raw.errors import RecipeError
from eagle3_raw.recipe import load_recipe
from eagle3_raw.resources import builder_scripts_dir
from tests.helpers import reference_server
from tests.support import tokenizers

REFERENCE_TEMPLATE = Path(__file__).parents[1] / "scripts" / "reference_corpus" / "chat_template.jinja"
COMMIT = "0123456789abcdef0123456789abcdef01234567"

#: recipe, npm tokenizer standing in for its model, extra overrides
FAMILIES = [
    ("qwen3", "qwen3", {}),
    ("deepseek-v3", "deepseek_v3", {}),
    ("llama-3.1", "llama3_1", {}),
    # the npm gpt-oss package ships no chat template (and so no date): the reference one instead
    ("gpt-oss", "gptoss", {"model.chat_template": str(REFERENCE_TEMPLATE), "model.render_date": None}),
]


def test_every_bundled_recipe_is_valid() -> None:
    names = sorted(p.stem for p in builder_scripts_dir().glob("*.yaml"))
    assert {"demo", "qwen3", "kimi-k2.5", "gpt-oss", "llama-3.1", "deepseek-v3"} <= set(names)
    assert {"qwen3-vllm", "kimi-k2.5-vllm", "llama-3.1-vllm", "deepseek-v3-vllm"} <= set(names)
    for name in names:
        if name.startswith("kimi-k2.5"):
            with pytest.raises(RecipeError, match=r"pin model\.revision to a commit"):
                load_recipe(name)
            recipe = load_recipe(name, {"model.revision": COMMIT})
            assert recipe.model.trust_remote_code and recipe.model.chat_template_kwargs == {"thinking": True}
        else:
            recipe = load_recipe(name)
        assert recipe.sampling.params["max_new_tokens"] >= 512
        assert (recipe.server.engine_name == "vllm") == name.endswith("-vllm")


@pytest.mark.slow
@pytest.mark.parametrize(("name", "folder", "extra"), FAMILIES, ids=[f[0] for f in FAMILIES])
def test_a_bundled_recipe_builds_with_its_familys_tokenizer(
    tmp_path: Path, name: str, folder: str, extra: dict[str, Any]
) -> None:
    tokenizer = tokenizers.tokenizer_folder(folder)
    shutil.copytree(builder_scripts_dir() / "prompts", tmp_path / "prompts")
    with reference_server(tmp_path, "--model-path", str(tokenizer)) as (server, _):
        overrides = {
            "model.tokenizer": str(tokenizer), "server.endpoints": [server.url],
            "prompts.source": str(tmp_path / "prompts"), "prompts.limit": 6, "sampling.max_new_tokens": 16,
            **extra,
        }  # fmt: skip
        if "model.chat_template" in extra:  # the server renders with the same template
            overrides["model.render"] = "local"
        rows = eagle3_raw.load(
            name, cache_dir=str(tmp_path / "c"), journal_dir=tmp_path / "j", progress="none", **overrides
        )
    assert len(rows) >= 6 and all(row["prompt_len"] > 0 for row in rows)
