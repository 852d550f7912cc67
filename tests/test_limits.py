"""Every bound on what a recipe makes eagle3_raw read (issue 13, finding 7): each one crossed, each
with its clear error, before anything is read, with memory measured where it could blow up."""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_raw import limits
from eagle3_raw.errors import RecipeError
from eagle3_raw.recipe import load_recipe
from eagle3_raw.resources import reference_model_dir
from eagle3_raw.run.render import Renderer
from tests.support.opened import opened_under
from tests.support.pace import scaled

MB = 1 << 20


def _recipe(folder: Path, **sections: Any) -> Path:
    (folder / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    raw: dict[str, Any] = {
        "name": "t",
        "prompts": {"source": "prompts.jsonl"},
        "server": {"endpoints": ["http://127.0.0.1:9"]},
        "sampling": {"max_new_tokens": 8},
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    path = folder / "r.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _peak(function: Any) -> tuple[BaseException | None, int]:
    tracemalloc.start()
    try:
        function()
        error: BaseException | None = None
    except Exception as exc:  # the caller asserts which
        error = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return error, peak


LAUGHS = "\n".join(
    ["name: laughs", "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
    + ["prompts: {source: p.jsonl}", "server: {endpoints: [http://127.0.0.1:9]}", "sampling:",
       "  max_new_tokens: 8", "  stop: *i"]
)  # fmt: skip


def test_a_billion_laughs_recipe_is_refused_within_a_few_megabytes(tmp_path: Path) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(LAUGHS)
    assert path.stat().st_size < 700  # 9^9 = 387 million strings once expanded
    error, peak = _peak(lambda: load_recipe(path))
    assert isinstance(error, RecipeError) and "expands to more than 100,000 values" in str(error), error
    assert peak < 16 * MB, f"peak {peak / MB:.1f} MB"


def test_a_recipe_that_contains_itself_is_refused(tmp_path: Path) -> None:
    path = _recipe(tmp_path)
    path.write_text(path.read_text() + "description: &d [x, *d]\n")
    with pytest.raises(RecipeError, match="expands to more than"):
        load_recipe(path)


def test_a_recipe_file_over_a_megabyte_is_refused_unread(tmp_path: Path) -> None:
    path = _recipe(tmp_path)
    path.write_text(path.read_text() + "#" * (limits.RECIPE_BYTES + 1) + "\n")
    with opened_under(path) as seen, pytest.raises(RecipeError, match=r"at most 1,048,576 are read"):
        load_recipe(path)
    assert seen == []


def test_python_yaml_tags_are_refused_and_never_run(tmp_path: Path) -> None:
    """Keeps holding: the YAML is read with the safe loader, whatever the tag."""
    marker = tmp_path / "ran"
    path = _recipe(tmp_path)
    path.write_text(path.read_text() + f'description: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(RecipeError, match=r"python/object/apply:os\.system"):
        load_recipe(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("section", "key", "value", "maximum"),
    [
        ("server", "max_in_flight", 2_000_000, "4,096"),
        ("server", "max_retries", 10**6, "100"),
        ("server", "request_timeout", 1e12, "604,800"),
        ("server", "connect_timeout", 10**7, "3,600"),
        ("server", "wait_for_server", 1e9, "604,800"),
        ("sampling", "max_new_tokens", 2**40, "16,777,216"),
        ("sampling", "samples_per_prompt", 10**6, "1,024"),
    ],
)
def test_numeric_settings_have_sane_maxima(
    tmp_path: Path, section: str, key: str, value: float, maximum: str
) -> None:
    with pytest.raises(RecipeError, match=rf"'{section}\.{key}'.*expected at most {maximum}"):
        load_recipe(_recipe(tmp_path, **{section: {key: value}}))


def test_a_template_that_is_a_device_is_refused_before_it_is_read(tmp_path: Path) -> None:
    (tmp_path / "template.jinja").symlink_to("/dev/zero")
    for template in ("/dev/zero", "template.jinja"):
        recipe = _recipe(tmp_path, model={"chat_template": template})
        error, peak = _peak(lambda recipe=recipe: load_recipe(recipe))
        assert isinstance(error, RecipeError) and "expected a regular file" in str(error), error
        assert peak < 4 * MB


def test_a_template_file_over_a_megabyte_is_refused(tmp_path: Path) -> None:
    (tmp_path / "big.jinja").write_text("{{ messages }}" + " " * limits.TEMPLATE_BYTES)
    with pytest.raises(RecipeError, match=r"'model\.chat_template'.*at most 1,048,576 are read"):
        load_recipe(_recipe(tmp_path, model={"chat_template": "big.jinja"}))


def test_a_prompt_source_that_is_a_device_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"'prompts\.source'.*expected a regular file or a folder"):
        load_recipe(_recipe(tmp_path, prompts={"source": "/dev/zero"}))


def test_a_tokenizer_folder_with_thousands_of_files_is_refused_before_any_is_read(tmp_path: Path) -> None:
    """``model.tokenizer: /usr/lib`` hashed 41k files before anything else; now the folder is
    counted first and not one of its files is opened."""
    lib = tmp_path / "lib"
    for i in range(limits.TOKENIZER_FILES + 1):
        (lib / f"d{i // 100}").mkdir(parents=True, exist_ok=True)
        (lib / f"d{i // 100}" / f"f{i}.json").write_text("{}")
    with opened_under(lib) as seen, pytest.raises(RecipeError, match=r"more than 512 files or"):
        load_recipe(_recipe(tmp_path, model={"tokenizer": str(lib)}))
    assert seen == []


def test_a_folder_too_large_to_walk_is_refused_quickly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "WALK_ENTRIES", 50)
    lib = tmp_path / "lib"
    for i in range(60):
        (lib / f"weights-{i}").mkdir(parents=True)  # nothing digestible: only the walk is bounded
    started = time.monotonic()
    with pytest.raises(RecipeError, match=r"more than 50 entries below it"):
        load_recipe(_recipe(tmp_path, model={"tokenizer": str(lib)}))
    assert time.monotonic() - started < scaled(5)


@pytest.mark.skipif(not Path("/usr/lib").is_dir(), reason="no /usr/lib here")
def test_usr_lib_as_a_tokenizer_is_refused_in_seconds(tmp_path: Path) -> None:
    started = time.monotonic()
    with opened_under(Path("/usr/lib")) as seen, pytest.raises(RecipeError, match="a tokenizer folder holds"):
        load_recipe(_recipe(tmp_path, model={"tokenizer": "/usr/lib"}))
    assert seen == [] and time.monotonic() - started < scaled(10)


def test_a_real_tokenizer_folder_passes(tmp_path: Path) -> None:
    recipe = load_recipe(_recipe(tmp_path, model={"tokenizer": str(reference_model_dir())}))
    assert Renderer(recipe).vocab_size > 0


def test_a_chat_template_inside_a_tokenizer_is_bounded_too(tmp_path: Path) -> None:
    import shutil

    import orjson

    folder = tmp_path / "tok"
    shutil.copytree(reference_model_dir(), folder)
    config = orjson.loads((folder / "tokenizer_config.json").read_bytes())
    config["chat_template"] = "{{ messages }}" + " " * limits.TEMPLATE_BYTES
    (folder / "tokenizer_config.json").write_bytes(orjson.dumps(config))
    for name in os.listdir(folder):
        if name.endswith(".jinja"):
            (folder / name).unlink()
    recipe = load_recipe(_recipe(tmp_path, model={"tokenizer": str(folder)}))
    with pytest.raises(RecipeError, match=r"'model\.chat_template'.*a chat template of at most"):
        Renderer(recipe)
