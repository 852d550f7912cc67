"""Recipe parsing, validation messages, overrides and the fingerprint."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_raw.errors import RecipeError, RecipeFileError
from eagle3_raw.recipe import Recipe, load_recipe, parse_set_args


def _raw(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "t",
        "prompts": {"source": "prompts.jsonl"},
        "server": {"endpoints": ["http://127.0.0.1:30000"]},
        "sampling": {"max_new_tokens": 64, "temperature": 0.7},
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            raw.setdefault(section, {})[field] = value
        else:
            raw[section] = value
    return raw


@pytest.fixture()
def recipe_dir(tmp_path: Path) -> Path:
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    return tmp_path


def _load(recipe_dir: Path, **changes: Any) -> Recipe:
    path = recipe_dir / "r.yaml"
    path.write_text(yaml.safe_dump(_raw(**changes)))
    return load_recipe(path)


def test_yaml_round_trip_keeps_every_field(recipe_dir: Path) -> None:
    recipe = _load(recipe_dir, turns="all", model__chat_template_kwargs={"enable_thinking": False})
    again = load_recipe(yaml.safe_load(recipe.to_yaml()))
    assert again.to_dict() == recipe.to_dict()
    assert again.turns == "all" and again.model.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize(
    ("changes", "field", "hint"),
    [
        ({"turns": "first"}, "turns", "last, all"),
        ({"sampling__top_p": 0.0}, "sampling.top_p", "(0, 1]"),
        ({"sampling__top_k": 0}, "sampling.top_k", "-1 (all)"),
        ({"sampling__seed_": 1}, "sampling.seed_", "not an SGLang sampling key"),
        ({"sampling__max_tokens": 5}, "sampling.max_tokens", "not an SGLang sampling key"),
        ({"sampling__n": 2}, "sampling.n", "samples_per_prompt"),
        ({"sampling__temperature": "hot"}, "sampling.temperature", ">= 0"),
        ({"sampling__samples_per_prompt": 0}, "sampling.samples_per_prompt", ">= 1"),
        ({"sampling__min_new_tokens": 5000}, "sampling.min_new_tokens", "at most sampling.max_new_tokens"),
        ({"prompts__format": "csv"}, "prompts.format", "sharegpt"),
        ({"prompts__limit": -3}, "prompts.limit", ">= 1"),
        ({"server": {}}, "server.endpoints", "launch: reference"),
        ({"server__endpoints": ["localhost:30000"]}, "server.endpoints", "http://"),
        ({"on_truncation": "cut"}, "on_truncation", "keep, drop"),
        ({"extra": 1}, "extra", "unknown field"),
        ({"on_truncaton": "drop"}, "on_truncaton", "unknown field (did you mean 'on_truncation'?)"),
        (
            {"sampling__samples_per_promt": 2},
            "sampling.samples_per_promt",
            "did you mean 'samples_per_prompt'",
        ),
        ({"sampling__max_tokens": 5}, "sampling.max_tokens", "SGLang calls it max_new_tokens"),
        ({"name": "my-set\n"}, "name", "expected letters, digits"),  # issue 22, finding 8: a newline
        ({"name": "my-set\nrm -rf ~"}, "name", "expected letters, digits"),
    ],
)
def test_bad_field_names_field_value_and_allowed(
    recipe_dir: Path, changes: dict[str, Any], field: str, hint: str
) -> None:
    with pytest.raises(RecipeError) as info:
        _load(recipe_dir, **changes)
    assert info.value.field == field
    assert hint in str(info.value)
    assert field in str(info.value)


def test_max_new_tokens_is_required(recipe_dir: Path) -> None:
    raw = _raw()
    del raw["sampling"]["max_new_tokens"]
    with pytest.raises(RecipeError, match="128"):
        load_recipe(raw)


def test_fingerprint_ignores_transport_and_resolves_defaults(recipe_dir: Path) -> None:
    base = _load(recipe_dir)
    transport = _load(
        recipe_dir,
        server={
            "endpoints": ["http://10.0.0.1:1", "http://10.0.0.2:1"],
            "max_in_flight": 7,
            "request_timeout": 5,
        },
    )
    explicit_defaults = _load(recipe_dir, sampling__top_p=1.0, sampling__top_k=-1, sampling__min_p=0)
    assert base.fingerprint == transport.fingerprint == explicit_defaults.fingerprint
    for key, value in _SPELLED_OUT_DEFAULTS:
        spelled = load_recipe(recipe_dir / "r.yaml", {f"sampling.{key}": value})
        assert spelled.fingerprint == base.fingerprint, f"sampling.{key}: {value!r}"
    not_default = load_recipe(recipe_dir / "r.yaml", {"sampling.ignore_eos": True})
    assert not_default.fingerprint != base.fingerprint


_SPELLED_OUT_DEFAULTS: list[tuple[str, Any]] = [
    ("ignore_eos", False),
    ("skip_special_tokens", True),
    ("spaces_between_special_tokens", True),
    ("no_stop_trim", False),
    ("min_new_tokens", 0),
    ("stop", []),
    ("stop", None),
    ("stop_token_ids", []),
    ("stop_token_ids", None),
    ("stop_regex", []),
    ("stop_regex", None),
    ("logit_bias", None),
    ("logit_bias", {}),
    ("json_schema", None),
    ("regex", None),
    ("ebnf", None),
    ("structural_tag", None),
    ("custom_params", None),
    ("beam_width", None),
    ("watermark", None),
]


@pytest.mark.parametrize(
    "changes",
    [
        {"sampling__temperature": 0.0},
        {"sampling__max_new_tokens": 65},
        {"sampling__seed": 1},
        {"sampling__samples_per_prompt": 2},
        {"turns": "all"},
        {"on_truncation": "drop"},
        {"prompts__limit": 10},
        {"model__chat_template_kwargs": {"enable_thinking": False}},
        {"sampling__ignore_eos": True},
        {"sampling__skip_special_tokens": False},
        {"sampling__no_stop_trim": True},
        {"sampling__min_new_tokens": 1},
        {"sampling__stop": ""},
        {"sampling__stop": ["</s>"]},
        {"sampling__stop_token_ids": [2]},
        {"sampling__stop_regex": [""]},
        {"sampling__logit_bias": {"5": 1.0}},
    ],
)
def test_fingerprint_changes_with_data_changing_fields(recipe_dir: Path, changes: dict[str, Any]) -> None:
    assert _load(recipe_dir).fingerprint != _load(recipe_dir, **changes).fingerprint


def test_fingerprint_follows_source_content_not_path(
    recipe_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    before = _load(recipe_dir)
    elsewhere = tmp_path_factory.mktemp("moved")
    (elsewhere / "prompts.jsonl").write_bytes((recipe_dir / "prompts.jsonl").read_bytes())
    assert _load(elsewhere).fingerprint == before.fingerprint
    (recipe_dir / "prompts.jsonl").write_text('{"prompt": "hello"}\n')
    assert _load(recipe_dir).fingerprint != before.fingerprint


def test_overrides_dotted_sections_and_set_args(recipe_dir: Path) -> None:
    path = recipe_dir / "r.yaml"
    path.write_text(yaml.safe_dump(_raw()))
    by_set = load_recipe(path, ["sampling.temperature=0", "prompts.limit=5", "server.endpoints=[http://h:1]"])
    by_dotted = load_recipe(
        path, {"sampling.temperature": 0, "prompts.limit": 5, "server.endpoints": ["http://h:1"]}
    )
    by_section = load_recipe(
        path,
        {"sampling": {"temperature": 0}, "prompts": {"limit": 5}, "server": {"endpoints": ["http://h:1"]}},
    )
    assert by_set.to_dict() == by_dotted.to_dict() == by_section.to_dict()
    assert by_set.sampling.params["temperature"] == 0 and by_set.sampling.params["max_new_tokens"] == 64
    assert by_set.server.endpoints == ("http://h:1",)
    assert parse_set_args(["a.b=[1, 2]", "c=x"]) == {"a.b": [1, 2], "c": "x"}


def test_bad_set_argument_is_refused() -> None:
    with pytest.raises(RecipeError, match="KEY=VALUE"):
        parse_set_args(["sampling.temperature"])


def test_relative_paths_resolve_from_recipe_folder(recipe_dir: Path) -> None:
    recipe = _load(recipe_dir)
    assert recipe.resolve_path(recipe.prompts.source) == recipe_dir / "prompts.jsonl"


def test_name_defaults_to_file_stem(recipe_dir: Path) -> None:
    raw = _raw()
    del raw["name"]
    path = recipe_dir / "my-set.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert load_recipe(path).name == "my-set"


def test_request_params_send_resolved_defaults(recipe_dir: Path) -> None:
    params = _load(recipe_dir).sampling.request_params()
    assert params["max_new_tokens"] == 64 and params["temperature"] == 0.7
    assert params["top_p"] == 1.0 and params["top_k"] == 1073741824


def test_a_key_written_as_null_is_not_sent(recipe_dir: Path) -> None:
    """Null means SGLang's default; sent as null, SGLang would store None in place of ``True``."""
    recipe = _load(recipe_dir, sampling__skip_special_tokens=None, sampling__stop=None)
    params = recipe.sampling.request_params()
    assert "skip_special_tokens" not in params and "stop" not in params
    assert recipe.fingerprint == _load(recipe_dir).fingerprint


def test_fingerprint_of_folders_under_hidden_directories(tmp_path: Path) -> None:
    fingerprints = []
    for name, text in [("a", '{"prompt": "one"}\n'), ("b", '{"prompt": "two"}\n')]:
        folder = tmp_path / ".cache" / name
        folder.mkdir(parents=True)
        (folder / "p.jsonl").write_text(text)
        fingerprints.append(load_recipe(_raw(prompts={"source": str(folder)})).fingerprint)
    assert fingerprints[0] != fingerprints[1]


def test_fingerprint_counts_only_the_files_a_prompt_folder_is_read_from(tmp_path: Path) -> None:
    folder = tmp_path / "prompts"
    folder.mkdir()
    (folder / "p.jsonl").write_text('{"prompt": "one"}\n')
    before = load_recipe(_raw(prompts={"source": str(folder)})).fingerprint
    (folder / "README.md").write_text("notes")
    (folder / ".p.jsonl.swp").write_text("editor junk")
    assert load_recipe(_raw(prompts={"source": str(folder)})).fingerprint == before
    (folder / "q.parquet").write_bytes(b"PAR1")
    assert load_recipe(_raw(prompts={"source": str(folder)})).fingerprint != before


# --- the recipe file and the command line's values (issue 14) ------------------------------------


def test_a_missing_recipe_file_is_named_with_the_bundled_recipes(tmp_path: Path) -> None:
    with pytest.raises(RecipeFileError) as missing:
        load_recipe(tmp_path / "nope.yaml")
    assert str(missing.value) == (
        f"recipe file {tmp_path / 'nope.yaml'}: no such file, and no bundled recipe has that name "
        "(bundled: deepseek-v3, deepseek-v3-vllm, demo, gpt-oss, kimi-k2.5, kimi-k2.5-vllm, llama-3.1, "
        "llama-3.1-vllm, qwen3, qwen3-vllm)"
    )


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"name: caf\xe9\n", "not UTF-8 text (byte 0xe9 at offset 9); save it as UTF-8"),
        (b"name: t\nprompts: [\n", "not valid YAML (line 3, column 1: expected the node content"),
        (b"- a\n- b\n", "expected a YAML mapping at the top level, got list"),
    ],
)
def test_an_unusable_recipe_file_is_one_line_naming_it(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_bytes(content)
    with pytest.raises(RecipeError) as refused:
        load_recipe(path)
    assert str(refused.value).startswith(f"recipe file {path}: {problem}")
    assert "\n" not in str(refused.value)


def test_a_set_value_that_is_not_yaml_is_refused_with_the_item() -> None:
    with pytest.raises(RecipeError) as refused:
        parse_set_args(["sampling.stop=[unclosed"])
    assert refused.value.field == "--set" and refused.value.value == "sampling.stop=[unclosed"
    assert "VALUE is not valid YAML (line 1, column 10:" in str(refused.value)
    assert parse_set_args(["sampling.stop='[unclosed'"]) == {"sampling.stop": "[unclosed"}  # quoted: fine


def test_an_endpoints_override_replaces_launching_the_reference_server(
    recipe_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = recipe_dir / "r.yaml"
    path.write_text(yaml.safe_dump(_raw(server={"launch": "reference"})))
    assert load_recipe(path).server.launch == "reference"
    with caplog.at_level(logging.INFO, logger="eagle3_raw"):
        recipe = load_recipe(path, ["server.endpoints=[http://gpu-1:30000]"])
    assert recipe.server.endpoints == ("http://gpu-1:30000",) and recipe.server.launch is None
    assert "overridden: the recipe's server.launch ('reference') is not used" in caplog.text
    as_mapping = load_recipe(path, {"server": {"endpoints": "http://gpu-2:30000"}})
    assert as_mapping.server.launch is None  # a section override does the same
    # and the other way round: launching the reference server replaces the recipe's endpoints
    path.write_text(yaml.safe_dump(_raw()))
    launched = load_recipe(path, ["server.launch=reference"])
    assert launched.server.endpoints == () and launched.server.launch == "reference"


def test_a_recipe_with_both_endpoints_and_launch_is_refused(recipe_dir: Path) -> None:
    with pytest.raises(RecipeError, match=r"cannot be combined with server\.endpoints") as refused:
        _load(recipe_dir, server__launch="reference")
    assert refused.value.field == "server.launch"


def test_a_missing_template_file_is_named_as_the_template(recipe_dir: Path) -> None:
    with pytest.raises(RecipeError) as refused:
        _load(recipe_dir, model__chat_template="templates/chat.jinja")
    assert refused.value.field == "model.chat_template"
    assert str(refused.value) == (
        f"recipe field 'model.chat_template': got '{recipe_dir / 'templates' / 'chat.jinja'}'; "
        "no such file: does not exist; give a Jinja template file"
    )


@pytest.mark.parametrize("tokenizer", ["./models/qwen", "/nowhere/qwen", "~/models/qwen", "a/b/c"])
def test_a_missing_tokenizer_folder_is_not_called_a_bad_hub_id(recipe_dir: Path, tokenizer: str) -> None:
    with pytest.raises(RecipeError) as refused:
        _load(recipe_dir, model__tokenizer=tokenizer)
    assert refused.value.field == "model.tokenizer"
    assert "no tokenizer folder:" in str(refused.value) and "does not exist" in str(refused.value)
    assert "Repo id" not in str(refused.value)


GREEDY = {"weight": 1, "temperature": 0}
SAMPLED = {"weight": 3, "temperature": 0.8}


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0, "samples_per_prompt": 3},
        {"temperature": 1e-7, "samples_per_prompt": 2},  # SGLang makes it greedy too
        {"top_k": 1, "samples_per_prompt": 2},
        {"temperature": 0.7, "samples_per_prompt": 2, "mixture": [GREEDY, {**GREEDY, "top_p": 0.5}]},
    ],
    ids=["temperature-0", "below-1e-6", "top_k-1", "every-component-greedy"],
)
def test_greedy_sampling_with_several_samples_is_refused_naming_the_fix(
    recipe_dir: Path, sampling: dict[str, Any]
) -> None:
    """Issue 21 finding 3: greedy samples of one prompt are one answer written several times."""
    with pytest.raises(RecipeError) as refused:
        _load(recipe_dir, sampling={"max_new_tokens": 64, **sampling})
    message = str(refused.value)
    assert refused.value.field == "sampling.samples_per_prompt"
    assert "same answer" in message and "samples_per_prompt: 1" in message and "temperature: 0.7" in message


def test_one_greedy_sample_is_fine_and_a_greedy_mixture_component_is_warned_about(recipe_dir: Path) -> None:
    assert not _load(recipe_dir, sampling={"max_new_tokens": 64, "temperature": 0}).sampling.warnings()
    mixed = {"max_new_tokens": 64, "samples_per_prompt": 2, "mixture": [SAMPLED, GREEDY]}
    [warning] = _load(recipe_dir, sampling=mixed).sampling.warnings()
    assert warning.startswith("sampling.mixture[1] samples greedily") and "temperature > 0" in warning
    assert "samples_per_prompt: 1" in warning
    one = {**mixed, "samples_per_prompt": 1}
    assert not _load(recipe_dir, sampling=one).sampling.warnings()
    warmed = {**mixed, "temperature": 0, "mixture": [SAMPLED, {"weight": 1, "temperature": 0.5}]}
    assert not _load(recipe_dir, sampling=warmed).sampling.warnings()  # every component sets its own
