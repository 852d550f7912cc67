"""Recipes: one YAML file = one reproducible dataset.

A recipe is parsed into frozen dataclasses (:mod:`.schema`, each field declared once), read by one
generic reader (:mod:`.parsing`), loaded from files and overrides (:mod:`.loading`), and identified
by its fingerprint (:mod:`.fingerprint`): a hash of every field that changes the data, with
defaults resolved and local files (prompt sources, tokenizer, template override) identified by
their content. SGLang's sampling defaults and keys are in :mod:`.sampling`.
"""

from __future__ import annotations

from eagle3_raw.errors import RecipeError, RecipeFileError
from eagle3_raw.recipe.fields import did_you_mean
from eagle3_raw.recipe.fingerprint import (
    PROMPT_SUFFIXES,
    REFERENCE_TOKENIZER,
    digest_files,
    digest_path,
    digested_files,
    fingerprint_payload,
    is_digestible,
    is_hub_id,
    prompt_source_files,
    recipe_to_dict,
    shaping_payload,
    tokenizer_path,
)
from eagle3_raw.recipe.loading import (
    KEPT_COPY_MARK,
    apply_overrides,
    check_not_kept_copy,
    find_recipe_file,
    load_recipe,
    mark_kept_copy,
    parse_recipe,
    parse_set_args,
    read_yaml,
    yaml_problem,
)
from eagle3_raw.recipe.sampling import canonical_params, is_greedy
from eagle3_raw.recipe.schema import (
    ExportConfig,
    Merge,
    MixtureComponent,
    ModelConfig,
    OnTruncation,
    PromptFormat,
    PromptsConfig,
    Recipe,
    Render,
    RolloutConfig,
    SamplingConfig,
    ServerConfig,
    SGLangLaunch,
    SplitsConfig,
    Turns,
    VLLMLaunch,
)
from eagle3_raw.recipe.values import MAX_MIXTURE, check_url
from eagle3_raw.sglang.sampling import (
    MANAGED_SAMPLING_KEYS,
    SGLANG_OPTIONAL_SAMPLING_DEFAULTS,
    SGLANG_OPTIONAL_SAMPLING_KEYS,
    SGLANG_SAMPLING_DEFAULTS,
)

__all__ = [
    "KEPT_COPY_MARK",
    "MANAGED_SAMPLING_KEYS",
    "MAX_MIXTURE",
    "PROMPT_SUFFIXES",
    "REFERENCE_TOKENIZER",
    "SGLANG_OPTIONAL_SAMPLING_DEFAULTS",
    "SGLANG_OPTIONAL_SAMPLING_KEYS",
    "SGLANG_SAMPLING_DEFAULTS",
    "ExportConfig",
    "Merge",
    "MixtureComponent",
    "ModelConfig",
    "OnTruncation",
    "PromptFormat",
    "PromptsConfig",
    "Recipe",
    "RecipeError",
    "RecipeFileError",
    "Render",
    "RolloutConfig",
    "SGLangLaunch",
    "SamplingConfig",
    "ServerConfig",
    "SplitsConfig",
    "Turns",
    "VLLMLaunch",
    "apply_overrides",
    "canonical_params",
    "check_not_kept_copy",
    "check_url",
    "did_you_mean",
    "digest_files",
    "digest_path",
    "digested_files",
    "find_recipe_file",
    "fingerprint_payload",
    "is_digestible",
    "is_greedy",
    "is_hub_id",
    "load_recipe",
    "mark_kept_copy",
    "parse_recipe",
    "parse_set_args",
    "prompt_source_files",
    "read_yaml",
    "recipe_to_dict",
    "shaping_payload",
    "tokenizer_path",
    "yaml_problem",
]
