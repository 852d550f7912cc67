"""The trainer commands an export (or a card) prints, with the flags that make the hand-off whole.

- SpecForge 0.2.0: ``specforge train -c CONFIG`` takes dotted overrides (``specforge/cli.py:169-198``,
  ``specforge/config/schema.py:945-971``). ``data.prompts_path`` is the pre-tokenized source and
  exactly one source may be set (``schema.py:152-165``), hence ``data.train_data_path=``;
  ``data.max_length`` defaults to 2048; ``model.vocab_mapping_path`` is required by online runs.
  The mapping's size must equal the draft config's ``draft_vocab_size``: 32000 when SpecForge
  derives the draft config from the target (``specforge/algorithms/eagle3/providers.py:185``),
  else give ``model.draft_model_config``.
- speculators 0.9.0: ``prepare-data`` skips the token frequencies unless ``--no-skip-token-freq``
  (``speculators/cli/prepare_data.py:170-179``), and ``train --draft-vocab-size N`` then finds no
  ``token_freq.pt`` and trains the full vocabulary with only a warning (``speculators/train/
  cli.py:420-435``); ``--d2t-path``/``--t2d-path`` load a mapping as is. Its ``hf:`` spec
  (``hf:<id>:<subset>:<split>``, ``preprocessing.py:642-691``) has no revision: it reads the
  default branch.

What each trainer does with a held-out split (:func:`validation_notes`), read in their sources:

- SpecForge: ``data.eval_data_path`` is "Reserved migration field. Online evaluation is
  unsupported; keep empty." and ``data.eval_hidden_states_path`` is offline evaluation over
  precomputed hidden-state files (``specforge/config/schema.py``, ``DataConfig``): no option takes
  pre-tokenized validation rows.
- speculators: ``train`` takes one ``--data-path`` and holds out its own share of it,
  ``--train-data-ratio`` (default 0.9: "the remainder is held out for validation",
  ``src/speculators/train/config/schema.py``, ``DataArgs``; ``train/dataloader.py``
  ``create_train_val_loaders``): no option takes another folder as validation.
- Model-Optimizer: its speculative-decoding example reads ``data.data_path`` only
  (``examples/speculative_decoding/main.py``); no validation-data option was found.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

MODEL = "TARGET_MODEL"
"""Placeholder for the target model (Hub id or folder) in printed commands."""


def specforge_train(data: str, max_length: int, mapping: str | None) -> str:
    """The ``specforge train`` overrides for a pre-tokenized JSONL file and a vocabulary mapping."""
    words = ["specforge", "train", "-c", "online.yaml", "data.train_data_path="]
    words += [f"data.prompts_path={data}", f"data.max_length={max_length}"]
    return shlex.join([*words, f"model.vocab_mapping_path={mapping or 'vocab_mapping-N.pt'}"])


def speculators_prepare(
    data: str, seq_length: int, output: str = "./training_data", *, token_freq: bool = True
) -> str:
    """``speculators prepare-data`` for pre-tokenized rows (a folder, a JSONL file or an ``hf:`` spec);
    ``token_freq``: with the token frequencies the draft vocabulary is built from."""
    words = ["speculators", "prepare-data", "--model", MODEL, "--data", data, "--output", output]
    freq = ["--no-skip-token-freq"] if token_freq else []
    return shlex.join([*words, "--seq-length", str(seq_length), *freq])


def speculators_train(size: int | None, d2t: str | None = None, t2d: str | None = None) -> str:
    """``speculators train`` with the draft vocabulary (the mapping files when given)."""
    words = ["speculators", "train", "--verifier-name-or-path", MODEL, "--data-path", "./training_data"]
    words += ["--draft-vocab-size", str(size) if size else "N"]
    if d2t and t2d:
        words += ["--d2t-path", d2t, "--t2d-path", t2d]
    return shlex.join(words)


def hf_spec(repo_id: str, config: str) -> str:
    """speculators' spec for a published set: ``hf:<repo>:<config>:train`` (no revision possible)."""
    return f"hf:{repo_id}:{config}:train"


def modelopt_note(data: str, d2t: str | None) -> str:
    """What Model-Optimizer can do with the export today."""
    cache = f"; data.draft_vocab_cache={d2t}" if d2t else ""
    return (
        f"Model-Optimizer 0.47.0 reads text/messages only; {data} holds token_ids + loss_mask rows "
        f"for the pre-tokenized input its open PRs 2338/2340 propose{cache}"
    )


def for_layout(
    layout: str, data: str, max_length: int, sizes: Sequence[int], folder: str, *, hub: tuple[str, str] | None
) -> list[str]:
    """The commands to hand ``layout``'s export in ``folder`` to its trainer (the first draft size)."""
    size = sizes[0] if sizes else None

    def written(name: str) -> str | None:
        return f"{folder}/{name}" if size else None

    if layout == "specforge":
        return [specforge_train(data, max_length, written(f"vocab_mapping-{size}.pt"))]
    if layout == "speculators":
        prepare = [speculators_prepare(data.rsplit("/", 1)[0], max_length)]
        if hub is not None:
            prepare.append(speculators_prepare(hf_spec(*hub), max_length) + "  # the published set as is")
        return [*prepare, speculators_train(size, written(f"d2t-{size}.npy"), written(f"t2d-{size}.npy"))]
    if layout == "modelopt":
        return [modelopt_note(data, written(f"d2t-{size}.pt"))]
    return []


def validation_notes(layout: str, data: str, validation: str, seq_length: int) -> list[str]:
    """What ``layout``'s trainer can do with the held-out split written to ``validation`` (the
    train rows in ``data``), in the trainer's own option names; said plainly where it has none."""
    if layout == "specforge":
        return [
            f"SpecForge has no validation option for pre-tokenized rows (data.eval_data_path is reserved: "
            f"online evaluation is unsupported; data.eval_hidden_states_path takes offline hidden states "
            f"only): train on {data} alone and measure a drafter on {validation} apart"
        ]
    if layout == "speculators":
        folder = validation.rsplit("/", 1)[0]
        return [
            f"speculators train has no validation-path option: it holds out 1 - --train-data-ratio "
            f"(default 0.9) of --data-path itself; {validation} is outside data/ so prepare-data leaves "
            "it out; to keep this split for your own measurement, prepare it apart:",
            speculators_prepare(folder, seq_length, "./validation_data", token_freq=False),
        ]
    if layout == "modelopt":
        return [
            f"Model-Optimizer's speculative-decoding example takes no validation-data option "
            f"(data.data_path only): train on {data}; {validation} holds the held-out rows"
        ]
    return [f"the held-out rows, same columns as {data}: {validation}"]


def for_card(repo_id: str, revision: str, name: str, longest: int, size: int | None) -> dict[str, str]:
    """The card's hand-off commands for config ``name`` at ``revision`` (``size``: a published mapping)."""
    hub = ["eagle3-raw", "export", "--hub", f"{repo_id}@{revision}", "--config", name]
    draft = ["--draft-vocab-size", str(size) if size else "N"]
    mapping = f"vocab_mapping-{size or 'N'}.pt"
    download = ["hf", "download", repo_id, f"recipes/{name}/vocab/{mapping}", "--repo-type", "dataset"]
    return {
        "speculators_prepare": speculators_prepare(hf_spec(repo_id, name), longest),
        "speculators_export": shlex.join([*hub, "--layout", "speculators", "--output", "./export"]),
        "speculators_prepare_pinned": speculators_prepare("./export/data", longest),
        "speculators_train": speculators_train(size),
        "specforge_export": shlex.join([*hub, "--layout", "specforge", "--output", "./export", *draft]),
        "specforge_train": specforge_train(f"./export/{name}.jsonl", longest, f"./export/{mapping}"),
        "download": shlex.join([*download, "--revision", revision, "--local-dir", "."]),
        "modelopt_export": shlex.join([*hub, "--layout", "modelopt", "--output", "./export", *draft]),
    }
