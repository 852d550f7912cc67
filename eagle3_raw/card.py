"""The dataset card: Hub metadata merged into what ``push_to_hub`` wrote, one body section per config.

A card is the README that ``Dataset.push_to_hub`` committed (its YAML carries ``configs`` and
``dataset_info``, which must survive), updated in three ways:

- metadata (:func:`update_metadata`): ``license``, ``task_categories``, ``size_categories`` (from the
  rows of every config in ``dataset_info``), ``tags`` and ``source_datasets`` are merged in; every
  other key is kept as it is;
- body (:func:`merge_body`): an intro is written once when the body is empty, and each config gets a
  section between ``<!-- eagle3_raw:config:<name>:start -->`` and ``...:end -->`` markers. A later
  push of a config replaces its own section only; text outside the markers is never touched;
- a picture (:func:`lengths_svg`): the length distribution as a small self-contained SVG.

Sections are rendered from the Jinja templates in ``dataset_cards/`` (see
:func:`eagle3_raw.resources.dataset_cards_dir`) from two plain mappings: the published recipe and the
manifest written by :mod:`eagle3_raw.hub`.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from eagle3_raw.errors import HubError
from eagle3_raw.export.commands import for_card
from eagle3_raw.recipe import is_greedy
from eagle3_raw.resources import dataset_cards_dir
from eagle3_raw.serving import ENGINE_LABELS

if TYPE_CHECKING:
    import jinja2
    from huggingface_hub.repocard_data import CardData
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "CardSection", "Example", "decode_example", "lengths_svg", "merge_body", "render_section", "update_card",
    "update_metadata",
]  # fmt: skip

TAGS = ("eagle3", "speculative-decoding", "sglang", "synthetic")
TASK_CATEGORIES = ("text-generation",)
GENERATED_START = "⟦generated⟧"
GENERATED_END = "⟦/generated⟧"
INTRO_START = "<!-- eagle3_raw:intro:start -->"
INTRO_END = "<!-- eagle3_raw:intro:end -->"
MAX_REASONS = 20
"""Skip and failure reasons listed on the card (all of them are in the manifest)."""

_SIZE_CATEGORIES = (
    (1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
    (10**7, "1M<n<10M"), (10**8, "10M<n<100M"), (10**9, "100M<n<1B"), (10**10, "1B<n<10B"),
    (10**11, "10B<n<100B"), (10**12, "100B<n<1T"),
)  # fmt: skip
_MARKER_LIKE = re.compile(r"<!--\s*eagle3_raw:")
_LENGTH_LABELS = (("prompt", "prompt"), ("generated", "generated"), ("total", "total (`len(input_ids)`)"))


@dataclass(frozen=True)
class Example:
    """One row decoded for display, the generated span between :data:`GENERATED_START`/``END``."""

    id: str
    text: str
    prompt_tokens: int
    generated_tokens: int
    finish_reason: str
    shortened: bool


@dataclass(frozen=True)
class CardSection:
    """What one config's section shows: the published recipe, the manifest, where to load it from."""

    repo_id: str
    name: str
    revision: str
    recipe: Mapping[str, Any]
    manifest: Mapping[str, Any]
    example: Example | None = None
    vocab: Mapping[str, Any] | None = None

    @property
    def svg_path(self) -> str:
        """The length picture's path in the repo (relative links resolve on the Hub)."""
        return f"recipes/{self.name}.lengths.svg"


# --- the whole card ----------------------------------------------------------------------------


def update_card(readme: str, section: CardSection) -> tuple[str, list[str]]:
    """``readme`` with merged metadata and ``section`` in place; also the warnings to show.

    ``readme`` is the README at the commit ``push_to_hub`` just made; its ``configs`` and
    ``dataset_info`` and everything outside this config's markers are kept as they are.
    """
    from huggingface_hub import DatasetCard

    card = DatasetCard(readme)
    warnings = update_metadata(
        card.data,
        license=section.recipe.get("license"),
        source_datasets=source_datasets(section.recipe, section.manifest),
    )
    card.text = merge_body(card.text, section.name, render_section(section), render_intro(section.repo_id))
    return str(card), warnings


def source_datasets(recipe: Mapping[str, Any], manifest: Mapping[str, Any]) -> list[str]:
    """The Hub prompt source of the recipe, if its prompts came from the Hub."""
    return [str(recipe["prompts"]["source"])] if manifest.get("prompt_source") == "hub" else []


# --- metadata ----------------------------------------------------------------------------------


def update_metadata(data: CardData, *, license: str | None, source_datasets: Sequence[str]) -> list[str]:
    """Merge eagle3_raw's metadata into ``data`` in place; returns warnings (a license conflict).

    Lists are unions in first-seen order; ``size_categories`` follows the total rows of every config
    in ``dataset_info``; a ``license`` already set to another value is kept (one license per repo).
    """
    data["tags"] = _union(data.get("tags"), TAGS)
    data["task_categories"] = _union(data.get("task_categories"), TASK_CATEGORIES)
    data["size_categories"] = [size_category(total_rows(data.get("dataset_info")))]
    if source_datasets:
        data["source_datasets"] = _union(data.get("source_datasets"), source_datasets)
    current = data.get("license")
    if license is None or current in (None, license):
        data["license"] = current or license
        return []
    return [f"the card keeps license {current!r}; this config's recipe says {license!r}"]


def total_rows(dataset_info: Any) -> int:
    """Rows over every config and split of a card's ``dataset_info`` (a mapping or a list of them)."""
    infos = dataset_info or []
    infos = [infos] if isinstance(infos, Mapping) else infos
    return sum(
        int(split.get("num_examples") or 0)
        for info in infos
        if isinstance(info, Mapping)
        for split in info.get("splits") or []
        if isinstance(split, Mapping)
    )


def size_category(rows: int) -> str:
    """The Hub's ``size_categories`` value for ``rows`` rows (``n<1K``, ``1K<n<10K``, ...)."""
    for bound, label in _SIZE_CATEGORIES:
        if rows < bound:
            return label
    return "n>1T"


def _union(existing: Iterable[str] | None, new: Iterable[str]) -> list[str]:
    merged = list(existing or [])
    return merged + [item for item in dict.fromkeys(new) if item not in merged]


# --- body --------------------------------------------------------------------------------------


def section_markers(name: str) -> tuple[str, str]:
    """The HTML comments that delimit config ``name``'s section."""
    return f"<!-- eagle3_raw:config:{name}:start -->", f"<!-- eagle3_raw:config:{name}:end -->"


def merge_body(body: str, name: str, section: str, intro: str) -> str:
    """``body`` with config ``name``'s section replaced (or appended), and the intro refreshed.

    The intro is added only to an empty body (a body someone wrote is theirs), and replaced where
    its markers are. Raises HubError when a section has a start marker without its end marker.
    """
    body = _replace_marked(body, (INTRO_START, INTRO_END), intro) or body
    if not body.strip():
        body = _marked(intro, (INTRO_START, INTRO_END))
    replaced = _replace_marked(body, section_markers(name), section)
    if replaced is not None:
        return replaced
    return body.rstrip("\n") + "\n\n" + _marked(section, section_markers(name))


def _replace_marked(body: str, markers: tuple[str, str], content: str) -> str | None:
    """``body`` with the text between ``markers`` replaced; None when the markers are absent."""
    start, end = markers
    begin = body.find(start)
    if begin < 0:
        return None
    finish = body.find(end, begin)
    if finish < 0:
        raise HubError(f"the dataset card has {start} but not {end}; fix the README by hand, then push again")
    return body[:begin] + _marked(content, markers).rstrip("\n") + body[finish + len(end) :]


def _marked(content: str, markers: tuple[str, str]) -> str:
    return f"{markers[0]}\n{content.strip()}\n{markers[1]}\n"


# --- rendering ---------------------------------------------------------------------------------


def render_intro(repo_id: str) -> str:
    """The text written once at the top of an empty card."""
    return _environment().get_template("intro.md.j2").render(title=repo_id)


def render_section(section: CardSection) -> str:
    """Config ``section.name``'s section (without its markers), from ``config_section.md.j2``.

    Marker-like comments inside it (a prompt quoting one) are defused, so they delimit nothing.
    """
    text = _environment().get_template("config_section.md.j2").render(**section_context(section))
    return _MARKER_LIKE.sub("<!-- eagle3_raw\u200b:", text)


def section_context(section: CardSection) -> dict[str, Any]:
    """The template variables of a section (see ``dataset_cards/config_section.md.j2``)."""
    recipe, manifest = section.recipe, section.manifest
    reasons = failure_reasons(manifest["counts"])
    return {
        "repo_id": section.repo_id,
        "name": section.name,
        "revision": section.revision,
        "description": (  # the recipe's (maybe a stranger's) as text; ours as Markdown
            plain_text(recipe["description"])
            if recipe.get("description")
            else f"Rows generated by recipe `{section.name}`."
        ),
        "counts": manifest["counts"],
        "fingerprint": manifest["fingerprint"],
        "partial": manifest.get("partial"),
        "reasons": reasons[:MAX_REASONS],
        "more_reasons": max(0, len(reasons) - MAX_REASONS),
        "prompts": _prompts_context(recipe, manifest),
        "turns": recipe["turns"],
        "tokenizer": without_local_paths(manifest.get("tokenizer") or {}),
        "server": without_local_paths(manifest.get("server")),
        "server_flags": server_flags(without_local_paths(manifest.get("server"))),
        "sampling": _sampling_context(recipe["sampling"], manifest.get("request_params")),
        "on_truncation": recipe["on_truncation"],
        "versions": manifest.get("versions") or {},
        "svg_path": section.svg_path,
        "lengths": _lengths_context(manifest.get("lengths") or {}),
        "example": section.example,
        "marks": {"start": GENERATED_START, "end": GENERATED_END},
        "reproduce_command": reproduce_command(section.repo_id, section.revision, section.name, recipe),
        "launches_reference": (recipe.get("server") or {}).get("launch") == "reference",
        "engine": ENGINE_LABELS.get(str((manifest.get("target") or {}).get("engine") or "sglang"), "SGLang"),
        "greedy": is_greedy(recipe["sampling"]),
        "samples_per_prompt": int(recipe["sampling"].get("samples_per_prompt") or 1),
        "acceptance": acceptance_context(manifest),
        "selection": selection_context(manifest),
        "splits": split_rows(manifest),
        **trainer_context(section),
    }


ACCEPTANCE_GROUPS = ("turn", "prompt length", "output length", "category", "finish reason")
"""The acceptance tables a card shows, in order (those the summary has)."""


def acceptance_context(manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The card's acceptance section (None when the server did not speculate): the drafter as the
    server reported it, the plot's path, and the summary's figures overall and by group."""
    published = manifest.get("acceptance")
    if not published:
        return None
    summary = published["summary"]
    groups = summary.get("groups") or {}
    return {
        "plot": published.get("plot"),
        "drafter": without_local_paths(dict((manifest.get("target") or {}).get("drafter") or {})),
        "overall": summary["overall"],
        "groups": [(name, list(groups[name].items())) for name in ACCEPTANCE_GROUPS if groups.get(name)],
    }


def selection_context(manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """A derived set's parent (config id, where it was pushed), its rules and the rows dropped by
    reason, in the rules' order (None: the set selects nothing)."""
    selection = manifest.get("selection")
    if not selection:
        return None
    parent = selection.get("parent") or {}
    return {
        "parent": str(parent.get("config_id") or "unknown"),
        "pushed": [str(where) for where in parent.get("pushed") or []],
        "rules": dict(selection.get("rules") or {}),
        "parent_rows": int(selection.get("parent_rows") or 0),
        "kept": int(selection.get("kept") or 0),
        "dropped": [(str(reason), int(count)) for reason, count in (selection.get("dropped") or {}).items()],
    }


def split_rows(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A set that holds a split out (the manifest's ``splits``): ``rule`` (how conversations were
    assigned) and ``rows``, (split, rows, conversations) each; empty for a set of one split."""
    splits = manifest.get("splits") or {}
    rows = [
        (name, int(splits[name].get("rows") or 0), int(splits[name].get("conversations") or 0))
        for name in ("train", "validation")
        if isinstance(splits.get(name), Mapping)
    ]
    rule = splits.get("rule")
    assigned = rule.get("assigned") if isinstance(rule, Mapping) else None
    return {"rule": str(assigned or ""), "rows": rows} if rows else {}


def trainer_context(section: CardSection) -> dict[str, Any]:
    """The draft vocabulary (``draft_vocab.json``) and the exact commands that hand the set to trainers."""
    vocab = dict(section.vocab or {})
    sizes = [int(size) for size in vocab.get("mapping_sizes") or []]
    longest = int(((section.manifest.get("lengths") or {}).get("total") or {}).get("max") or 2048)
    size = sizes[0] if sizes else None
    return {
        "vocab": vocab,
        "vocab_folder": f"recipes/{section.name}/vocab",
        "vocab_sizes": sizes,
        "coverage": [(int(size), float(share)) for size, share in (vocab.get("coverage") or {}).items()],
        "longest_row": longest,
        "commands": for_card(section.repo_id, section.revision, section.name, longest, size),
    }


def failure_reasons(counts: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """(kind, reason, count) of the skipped and failed rows, most frequent first."""
    rows = [
        (kind, str(reason), int(count))
        for kind in ("skipped", "failed")
        for reason, count in (counts.get(kind) or {}).items()
    ]
    return sorted(rows, key=lambda row: (-row[2], row[0], row[1]))


def without_local_paths(value: Any) -> Any:
    """``value`` (a string, or mappings and lists of them) with every absolute local path shown as
    ``…/<last part>``: the card says which model and tokenizer (``…/Qwen3-8B``), not where they sat
    on the machine that built the set (``/home/me/models/...``). Relative paths and Hub ids, as a
    recipe writes them, are kept."""
    if isinstance(value, str):
        return _shown_path(value)
    if isinstance(value, Mapping):
        return {key: without_local_paths(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [without_local_paths(item) for item in value]
    return value


_ABSOLUTE_PATH = re.compile(r"(?:/|~/|[A-Za-z]:[\\/]|\\\\)[^\s]*")


def _shown_path(text: str) -> str:
    if not _ABSOLUTE_PATH.fullmatch(text) or "://" in text:
        return text
    parts = [part for part in re.split(r"[\\/]+", text) if part and part != "~" and not part.endswith(":")]
    return f"…/{parts[-1]}" if parts else "…"


def server_flags(server: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The server's reported settings worth showing (identity keys and the command line left out)."""
    info = (server or {}).get("server_info") or {}
    hidden = {"version", "model_path", "served_model_name", "launch_command"}
    return [(key, _compact(value)) for key, value in sorted(info.items()) if key not in hidden]


def reproduce_command(repo_id: str, revision: str, name: str, recipe: Mapping[str, Any]) -> str:
    """The exact ``eagle3-raw reproduce`` command for this config."""
    command = f"eagle3-raw reproduce {repo_id}@{revision} --config {name}"
    if (recipe.get("server") or {}).get("launch") == "reference":
        return command + " --reference-server"
    return command + " --set server.endpoints=http://HOST:PORT"


def _prompts_context(recipe: Mapping[str, Any], manifest: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **recipe["prompts"],
        "hub": manifest.get("prompt_source") == "hub",
        "files": len(manifest.get("prompt_files") or []),
    }


def _sampling_context(sampling: Mapping[str, Any], sent: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``sampling_params`` every request carried (the recipe's, defaults made explicit)."""
    params = sent or {k: v for k, v in sampling.items() if k not in ("samples_per_prompt", "seed", "mixture")}
    return {
        "params": params,
        "seed": sampling.get("seed", 0),
        "samples_per_prompt": sampling.get("samples_per_prompt", 1),
        "mixture": list(sampling.get("mixture") or []),
    }


def _lengths_context(lengths: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [(label, lengths[key]) for key, label in _LENGTH_LABELS if key in lengths]


@functools.cache
def _environment() -> jinja2.Environment:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(dataset_cards_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # Markdown, not HTML: values are quoted by the filters below
    )
    env.filters.update(n=_number, code=inline_code, cell=table_cell, fenced=fenced, counts=_counts)
    env.filters["percent"] = lambda share: f"{share:.2%}"
    env.filters["figure"] = lambda value: "n/a" if value is None else f"{value:.3f}"
    env.filters["label"] = lambda value: plain_text(value).replace("\n", " ")
    env.filters["total"] = lambda mapping: sum((mapping or {}).values())
    return env


# --- Markdown helpers --------------------------------------------------------------------------


def inline_code(value: Any) -> str:
    """``value`` as inline code (mappings and lists as compact JSON), safe with backticks inside."""
    text = _compact(value).replace("\n", " ")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if longest else ""
    return f"{fence}{pad}{text}{pad}{fence}"


_MARKDOWN = re.compile(r"([\\`*_\[\]()#|~!+=-])")


def plain_text(value: Any) -> str:
    """``value`` (a recipe's description: the author's, or a stranger's) as text, never Markdown
    or HTML: ``<``, ``>`` and ``&`` as entities, Markdown's punctuation backslash-escaped (no link,
    image, heading, emphasis or table), each line's indentation dropped (no code block); blank
    lines still part paragraphs."""
    lines = (line.strip() for line in str(value).splitlines())
    escaped = (_MARKDOWN.sub(r"\\\1", html.escape(line, quote=False)) for line in lines)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(escaped)).strip()


def table_cell(value: Any) -> str:
    """``value`` as text that stays in one Markdown table cell."""
    return html.escape(str(value), quote=False).replace("|", "\\|").replace("\n", " ")


def fenced(text: str, info: str = "text") -> str:
    """``text`` in a code fence longer than any backtick run inside it."""
    longest = max((len(run) for run in re.findall(r"`{3,}", text)), default=2)
    fence = "`" * (longest + 1)
    return f"{fence}{info}\n{text.rstrip()}\n{fence}"


def _compact(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str).decode()


def _number(value: Any) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}" if isinstance(value, int | float) else str(value)


def _counts(counts: Mapping[str, int] | None) -> str:
    return ", ".join(f"`{k}` {v:,}" for k, v in sorted((counts or {}).items())) or "none"


# --- the example -------------------------------------------------------------------------------


def decode_example(
    tokenizer: PreTrainedTokenizerBase, record: Mapping[str, Any], *, max_chars: int = 1500
) -> Example:
    """``record`` (a row of the set) decoded for display, the generated span marked.

    Display only: the set's ids are never decoded and re-tokenized. The prompt keeps its last
    ``max_chars`` characters, the generated text its first ``max_chars``.
    """
    ids, boundary = list(record["input_ids"]), int(record["prompt_len"])
    prompt = str(tokenizer.decode(ids[:boundary], skip_special_tokens=False))
    generated = str(tokenizer.decode(ids[boundary:], skip_special_tokens=False))
    short_prompt, short_generated = _shorten(prompt, max_chars, keep="end"), _shorten(generated, max_chars)
    return Example(
        id=str(record["id"]),
        text=f"{short_prompt}{GENERATED_START}{short_generated}{GENERATED_END}",
        prompt_tokens=boundary,
        generated_tokens=len(ids) - boundary,
        finish_reason=str(record["finish_reason"]),
        shortened=(short_prompt, short_generated) != (prompt, generated),
    )


def _shorten(text: str, max_chars: int, *, keep: str = "start") -> str:
    if len(text) <= max_chars:
        return text
    cut = f"[... {len(text) - max_chars:,} characters ...]"
    return cut + text[-max_chars:] if keep == "end" else text[:max_chars] + cut


# --- lengths -----------------------------------------------------------------------------------


def length_stats(values: Sequence[int] | Any) -> dict[str, float | int]:
    """min, p50, p90, p99, max (ints) and mean of ``values`` (zeros when there are none)."""
    import numpy as np

    array = np.asarray(values, dtype=np.int64)
    if array.size == 0:
        return {"min": 0, "p50": 0, "p90": 0, "p99": 0, "max": 0, "mean": 0.0}
    p50, p90, p99 = (int(v) for v in np.percentile(array, [50, 90, 99], method="nearest"))
    mean = round(float(array.mean()), 1)
    return {
        "min": int(array.min()),
        "p50": p50,
        "p90": p90,
        "p99": p99,
        "max": int(array.max()),
        "mean": mean,
    }


def histogram(values: Sequence[int] | Any, bins: int = 40) -> tuple[list[int], int, int]:
    """Counts of ``values`` in at most ``bins`` equal integer-width bins; also the range ``[low, high)``."""
    import numpy as np

    array = np.asarray(values, dtype=np.int64)
    if array.size == 0:
        return [], 0, 0
    low, high = int(array.min()), int(array.max()) + 1
    width = max(1, -(-(high - low) // bins))
    count = -(-(high - low) // width)
    counts = np.bincount((array - low) // width, minlength=count)
    return [int(c) for c in counts], low, low + count * width


def lengths_svg(panels: Sequence[tuple[str, Sequence[int] | Any]], *, width: int = 640) -> str:
    """A self-contained SVG with one histogram per ``(title, values)`` panel, stacked."""
    height = 170
    body = "".join(
        _panel(title, values, top=i * height, width=width) for i, (title, values) in enumerate(panels)
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height * len(panels)}" '
        f'viewBox="0 0 {width} {height * len(panels)}" font-family="sans-serif" font-size="11">'
        f'<rect width="100%" height="100%" fill="white"/>{body}</svg>\n'
    )  # fmt: skip


def _panel(title: str, values: Sequence[int] | Any, *, top: int, width: int) -> str:
    counts, _, _ = histogram(values)
    stats = length_stats(values)
    left, plot_w, plot_h, base = 48, width - 64, 110, top + 140
    peak = max(counts, default=0) or 1
    bar_w = plot_w / max(1, len(counts))
    bars = "".join(
        f'<rect x="{left + i * bar_w:.1f}" y="{base - c / peak * plot_h:.1f}" '
        f'width="{max(bar_w - 1, 0.5):.1f}" height="{c / peak * plot_h:.1f}" fill="#4c78a8"/>'
        for i, c in enumerate(counts)
        if c
    )
    return (
        f'<text x="{left}" y="{top + 18}" font-size="13" font-weight="bold">{html.escape(title)}</text>'
        f'<line x1="{left}" y1="{base}" x2="{left + plot_w}" y2="{base}" stroke="#333"/>{bars}'
        f'<text x="{left - 4}" y="{base - plot_h + 4}" text-anchor="end">{peak:,}</text>'
        f'<text x="{left - 4}" y="{base + 4}" text-anchor="end">0</text>'
        f'<text x="{left}" y="{base + 16}">min {stats["min"]:,}</text>'
        f'<text x="{left + plot_w}" y="{base + 16}" text-anchor="end">max {stats["max"]:,} tokens</text>'
    )  # fmt: skip
