"""Dataset card rendering: metadata merge, per-config sections, Markdown safety, example, picture."""

from __future__ import annotations

import copy
import xml.etree.ElementTree as ET
from typing import Any

import pytest
import yaml

from eagle3_raw import card
from eagle3_raw.errors import HubError
from eagle3_raw.resources import dataset_cards_dir

# What Dataset.push_to_hub writes for a first config: metadata only, no body.
PUSHED = """---
dataset_info:
  config_name: alpha
  features:
  - name: id
    dtype: string
  splits:
  - name: train
    num_bytes: 100
    num_examples: 900
configs:
- config_name: alpha
  data_files:
  - split: train
    path: alpha/train-*
---
"""

RECIPE: dict[str, Any] = {
    "name": "alpha",
    "description": "Haiku answers.",
    "license": "apache-2.0",
    "prompts": {"source": "alpha/prompts/plain.jsonl", "format": "auto", "subset": None, "split": "train",
                "revision": None, "id_column": "id", "limit": 3, "shuffle_seed": None},
    "turns": "last",
    "model": {"tokenizer": "reference", "revision": None, "trust_remote_code": False,
              "chat_template": None, "chat_template_kwargs": {}},
    "server": {"endpoints": [], "launch": "reference", "launch_args": []},
    "sampling": {"max_new_tokens": 12, "temperature": 0, "samples_per_prompt": 1, "seed": 0},
    "on_truncation": "keep",
}  # fmt: skip

MANIFEST: dict[str, Any] = {
    "fingerprint": "0123456789abcdef",
    "prompt_source": "local",
    "prompt_files": ["recipes/alpha/prompts/plain.jsonl"],
    "versions": {"eagle3_raw": "0.1.0"},
    "server": {
        "version": "0.5.23", "model_path": "/models/m", "served_model_name": "m", "weight_version": "default",
        "server_info": {"tp_size": 1, "dtype": "auto", "launch_command": "python -m sglang ..."},
    },
    "tokenizer": {"tokenizer": "reference", "tokenizer_revision": "", "tokenizer_sha256": "aa" * 32,
                  "chat_template_sha256": "bb" * 32, "chat_template_kwargs": "{}", "vocab_size": "6144"},
    "counts": {"rows": 900, "prompt_tokens": 12_345, "generated_tokens": 6_789,
               "finish_reasons": {"stop": 850, "length": 50}, "dropped_truncated": 0,
               "skipped": {"row 'x': the chat template refused it | pipes": 2},
               "failed": {"8 attempts failed": 1}},
    "lengths": {key: {"min": 1, "p50": 2, "p90": 3, "p99": 4, "max": 5, "mean": 2.5}
                for key in ("prompt", "generated", "total")},
}  # fmt: skip


def _section(name: str = "alpha", **changes: Any) -> card.CardSection:
    recipe = {**copy.deepcopy(RECIPE), "name": name, **changes.pop("recipe", {})}
    manifest = {**copy.deepcopy(MANIFEST), **changes.pop("manifest", {})}
    return card.CardSection("alice/set", name, changes.pop("revision", "v1"), recipe, manifest, **changes)


def _front_matter(text: str) -> dict[str, Any]:
    assert text.startswith("---\n")
    data = yaml.safe_load(text.split("---\n", 2)[1])
    assert isinstance(data, dict)
    return data


def test_templates_ship_in_the_cards_folder() -> None:
    names = {p.name for p in dataset_cards_dir().iterdir()}
    assert {"intro.md.j2", "config_section.md.j2"} <= names


def test_update_card_merges_metadata_and_keeps_what_push_to_hub_wrote() -> None:
    text, warnings = card.update_card(PUSHED, _section())
    meta = _front_matter(text)
    assert warnings == []
    assert meta["configs"] == _front_matter(PUSHED)["configs"]
    assert meta["dataset_info"] == _front_matter(PUSHED)["dataset_info"]
    assert meta["license"] == "apache-2.0"
    assert meta["task_categories"] == ["text-generation"]
    assert meta["size_categories"] == ["n<1K"]
    assert meta["tags"] == ["eagle3", "speculative-decoding", "sglang", "synthetic"]
    assert "source_datasets" not in meta  # a local prompt source is not a Hub dataset


def test_hub_prompt_source_becomes_source_datasets() -> None:
    section = _section(
        recipe={"prompts": {**RECIPE["prompts"], "source": "org/prompts", "revision": "abc"}},
        manifest={"prompt_source": "hub", "prompt_files": []},
    )
    text, _ = card.update_card(PUSHED, section)
    assert _front_matter(text)["source_datasets"] == ["org/prompts"]
    assert "Hub dataset, split `train`" in text and "revision `abc`" in text


def test_existing_metadata_is_merged_not_replaced() -> None:
    readme = PUSHED.replace("---\n", "---\nlicense: mit\ntags:\n- mine\npretty_name: Mine\n", 1)
    text, warnings = card.update_card(readme, _section())
    meta = _front_matter(text)
    assert meta["tags"] == ["mine", "eagle3", "speculative-decoding", "sglang", "synthetic"]
    assert meta["pretty_name"] == "Mine"
    assert meta["license"] == "mit" and warnings and "apache-2.0" in warnings[0]


def test_size_categories_count_every_config() -> None:
    two = {"dataset_info": [
        {"config_name": "a", "splits": [{"name": "train", "num_examples": 600}]},
        {"config_name": "b", "splits": [{"name": "train", "num_examples": 600}]},
    ]}  # fmt: skip
    assert card.total_rows(two["dataset_info"]) == 1200
    assert card.total_rows({"splits": [{"num_examples": 7}]}) == 7
    assert card.total_rows(None) == 0
    assert [card.size_category(n) for n in (0, 999, 1000, 99_999, 100_000, 10**13)] == [
        "n<1K", "n<1K", "1K<n<10K", "10K<n<100K", "100K<n<1M", "n>1T",
    ]  # fmt: skip


def test_sections_are_appended_and_replaced_only_by_their_own_config() -> None:
    first, _ = card.update_card(PUSHED, _section("alpha"))
    both, _ = card.update_card(first, _section("beta"))
    body = both.split("---\n", 2)[2]
    assert body.count("<!-- eagle3_raw:intro:start -->") == 1
    assert body.index("eagle3_raw:config:alpha:start") < body.index("eagle3_raw:config:beta:start")
    again, _ = card.update_card(both, _section("alpha", recipe={"description": "Second version."}))
    assert again.count("<!-- eagle3_raw:config:alpha:start -->") == 1
    assert "Second version." in again and "Haiku answers." in again.split("config:beta:start")[1]
    beta = "<!-- eagle3_raw:config:beta:start -->"
    assert again.split(beta)[1] == both.split(beta)[1]


def test_a_body_someone_wrote_is_kept_and_gets_no_intro() -> None:
    body = card.merge_body("# My set\n\nHand-written.\n", "alpha", "SECTION", "INTRO")
    assert body.startswith("# My set\n\nHand-written.\n")
    assert "INTRO" not in body and body.rstrip().endswith("<!-- eagle3_raw:config:alpha:end -->")
    assert card.merge_body("", "alpha", "SECTION", "INTRO").startswith(
        "<!-- eagle3_raw:intro:start -->\nINTRO"
    )


def test_text_around_sections_survives_a_replacement() -> None:
    body = card.merge_body("Before.\n", "alpha", "OLD", "INTRO") + "\nAfter.\n"
    replaced = card.merge_body(body, "alpha", "NEW", "INTRO")
    assert replaced == body.replace("OLD", "NEW")


def test_a_section_without_its_end_marker_is_an_error() -> None:
    start, _ = card.section_markers("alpha")
    with pytest.raises(HubError, match="not <!-- eagle3_raw:config:alpha:end -->"):
        card.merge_body(f"{start}\nhalf a section\n", "alpha", "NEW", "INTRO")


def test_marker_text_inside_a_section_is_defused() -> None:
    start, end = card.section_markers("beta")
    quoting = _section("alpha", recipe={"description": f"a prompt that quotes {start} and {end}"})
    first, _ = card.update_card(PUSHED, quoting)
    text, _ = card.update_card(first, _section("beta", recipe={"description": "Beta."}))
    again, _ = card.update_card(text, _section("beta", recipe={"description": "Beta, second edition."}))
    assert again.count(start) == again.count(end) == 1
    alpha = again.split("eagle3_raw:config:alpha:start")[1].split("eagle3_raw:config:alpha:end")[0]
    assert "## Config `beta`" not in alpha
    assert "a prompt that quotes" in again and "Beta, second edition." in again and "Beta.\n" not in again


def test_the_recipes_description_is_shown_as_text_never_as_markdown_or_html() -> None:
    """Issue 22, finding 8: the card took a (maybe stranger's) recipe's description as raw Markdown/HTML."""
    hostile = (
        "Haiku answers.\n# Official\n<script>alert(1)</script><img src=x onerror=alert(1)>\n"
        "[the real set](http://evil.example/) ![logo](http://evil.example/x.png)\n    indented code\n"
        "| a | table |\n---\n**bold** _it_ <!-- eagle3_raw:config:alpha:end -->"
    )
    text = card.render_section(_section("alpha", recipe={"description": hostile}))
    body = text.split("## Config `alpha`")[1].split("| | |")[0]
    raws = ("<script", "<img", "](http", "![", "\n# ", "\n    indented", "\n| a |", "\n---\n", "**bold**")
    for raw in raws:
        assert raw not in body, raw
    assert "Haiku answers." in body and "&lt;script&gt;" in body and "\\[the real set\\]" in body
    assert "<!--" not in body  # no marker, no HTML comment: only the card's own markers stand


def test_section_shows_how_it_was_made_counts_and_how_to_use_it() -> None:
    text = card.render_section(_section())
    assert "## Config `alpha`" in text and "Haiku answers." in text
    assert "| rows | 900 |" in text and "| prompt tokens | 12,345 |" in text
    assert "`length` 50, `stop` 850" in text
    assert "| skipped | row 'x': the chat template refused it \\| pipes | 2 |" in text
    assert "| failed | 8 attempts failed | 1 |" in text
    assert "SGLang `0.5.23` serving `…/m` as `m`" in text
    assert "`dtype=auto`, `tp_size=1`" in text and "launch_command" not in text
    assert "tokenizer sha256 `" + "aa" * 32 + "`" in text and "chat template sha256 `" + "bb" * 32 in text
    assert (
        '`sampling_params` `{"max_new_tokens":12,"temperature":0}`' in text
        and "base seed 0" in text
        and "1 sample(s) per prompt" in text
    )
    assert "turns: `last`" in text and "1 file(s) uploaded beside the recipe" in text
    assert "![Length distribution of config alpha](recipes/alpha.lengths.svg)" in text
    assert 'load_dataset("alice/set", "alpha", revision="v1", split="train")' in text
    assert "--data hf:alice/set:alpha:train" in text and "--no-skip-token-freq" in text
    assert "data.prompts_path=./export/alpha.jsonl" in text and "model.vocab_mapping_path=" in text
    assert "eagle3-raw reproduce alice/set@v1 --config alpha --reference-server\n" in text
    assert "the recipe is greedy (temperature 0)" in text


def test_section_for_a_remote_server_and_an_unknown_server() -> None:
    recipe = {
        "server": {"endpoints": ["http://gpu:30000"], "launch": None},
        "sampling": {"max_new_tokens": 8},
    }
    text = card.render_section(_section(recipe=recipe, manifest={"server": None}))
    assert "--config alpha --set server.endpoints=http://HOST:PORT" in text
    assert "**Server**: unknown" in text and "the recipe samples (temperature > 0)" in text


def test_many_failure_reasons_are_cut_on_the_card() -> None:
    counts = {**MANIFEST["counts"], "failed": {f"reason {i}": i + 1 for i in range(30)}, "skipped": {}}
    text = card.render_section(_section(manifest={"counts": counts}))
    assert "| failed | reason 29 | 30 |" in text and "reason 0 |" not in text
    assert "... and 10 other reasons" in text


def test_rollouts_are_counted_as_samples_times_conversations() -> None:
    """Issue 21 finding 8: not "240 of 120 conversations"."""
    rollouts = {
        "rollouts": 240,
        "source_rows": 120,
        "turns": {"3": 240},
        "ended": {},
        "rows": {"rollout": 720},
    }
    sampling = {**RECIPE["sampling"], "temperature": 0.7, "samples_per_prompt": 2}
    counts = {**MANIFEST["counts"], "rollouts": rollouts}
    text = card.render_section(_section(recipe={"sampling": sampling}, manifest={"counts": counts}))
    assert "| 240 = 2 samples x 120 conversations |" in text
    counts["rollouts"] = {**rollouts, "rollouts": 239}
    text = card.render_section(_section(recipe={"sampling": sampling}, manifest={"counts": counts}))
    assert "| 239 of 2 samples x 120 conversations |" in text


def test_markdown_helpers_quote_what_they_are_given() -> None:
    assert card.inline_code("plain") == "`plain`"
    assert card.inline_code("a`b") == "`` a`b ``"
    assert card.inline_code({"b": 1, "a": [1]}) == '`{"a":[1],"b":1}`'
    assert card.table_cell("a|b\nc<d>") == "a\\|b c&lt;d&gt;"
    assert card.fenced("x\n```\ny") == "````text\nx\n```\ny\n````"


def test_decoded_example_marks_the_generated_span() -> None:
    from eagle3_raw.reference.model_files import load_tokenizer

    tokenizer = load_tokenizer()
    prompt = tokenizer.encode(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    generated = tokenizer.encode("Hello there.<|im_end|>", add_special_tokens=False)
    record = {
        "id": "r:1:0",
        "input_ids": prompt + generated,
        "prompt_len": len(prompt),
        "finish_reason": "stop",
    }
    example = card.decode_example(tokenizer, record)
    assert example.text.endswith("assistant\n⟦generated⟧Hello there.<|im_end|>⟦/generated⟧")
    assert (example.prompt_tokens, example.generated_tokens, example.shortened) == (
        len(prompt),
        len(generated),
        False,
    )
    short = card.decode_example(tokenizer, record, max_chars=5)
    assert short.shortened and short.text.startswith("[... ") and "there.<|im_end|>" not in short.text


def test_length_stats_and_histogram() -> None:
    stats = card.length_stats([1, 2, 3, 4, 100])
    assert stats == {"min": 1, "p50": 3, "p90": 100, "p99": 100, "max": 100, "mean": 22.0}
    assert card.length_stats([])["max"] == 0
    counts, low, high = card.histogram([5, 5, 6, 9], bins=40)
    assert (counts, low, high) == ([2, 1, 0, 0, 1], 5, 10)
    counts, low, high = card.histogram(range(1000), bins=10)
    assert counts == [100] * 10 and (low, high) == (0, 1000)


def test_lengths_svg_is_well_formed_xml() -> None:
    svg = card.lengths_svg([("generated <tokens>", [1, 2, 2, 3]), ("empty", [])])
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg") and root.get("height") == "340"
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "generated <tokens>" in texts and "empty" in texts
    assert "min 1" in texts and "max 3 tokens" in texts
    bars = [r for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("fill") == "#4c78a8"]
    assert len(bars) == 3


def test_the_card_shows_no_local_absolute_paths() -> None:
    """What the recipe wrote as a Hub id or a relative path stays; a machine's absolute paths become
    their last part (issue 14)."""
    manifest = {
        "server": {
            "version": "0.5.23", "model_path": "/home/me/models/Qwen3-8B",
            "served_model_name": "/home/me/models/Qwen3-8B", "weight_version": "default",
            "server_info": {"tokenizer_path": "/home/me/models/Qwen3-8B/", "download_dir": "/scratch/me/hf",
                            "tp_size": 2, "dtype": "bfloat16", "extra": ["/opt/x/lib", "keep me"]},
        },
        "tokenizer": {**MANIFEST["tokenizer"], "tokenizer": "/home/me/models/Qwen3-8B"},
    }  # fmt: skip
    text = card.render_section(_section(manifest=manifest))
    assert "/home/me" not in text and "/scratch" not in text and "/opt/x" not in text
    assert "serving `…/Qwen3-8B`" in text and "`tokenizer_path=…/Qwen3-8B`" in text
    assert "`download_dir=…/hf`" in text and "`tp_size=2`" in text and "keep me" in text
    assert "**Model and tokenizer**: `…/Qwen3-8B`" in text
    relative = {**manifest, "tokenizer": {**MANIFEST["tokenizer"], "tokenizer": "models/qwen"}}
    assert "**Model and tokenizer**: `models/qwen`" in card.render_section(_section(manifest=relative))
    hub_id = card.render_section(
        _section(manifest={**manifest, "server": {**manifest["server"], "model_path": "Qwen/Qwen3-8B"}})
    )
    assert "serving `Qwen/Qwen3-8B`" in hub_id
