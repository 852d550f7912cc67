"""Build the reference server's tiny model: tokenizer, chat template, config and segment library.

Usage: ``python scripts/build_reference_model.py [--out DIR]`` (default: the packaged model dir,
``eagle3_raw/reference/model``). The output is a pure function of this script, the files under
``scripts/reference_corpus/`` and the ``tokenizers`` training algorithm: running it twice writes
byte-identical files, and ``tests/reference/test_tokenizer.py`` checks the committed files against a
fresh build.

What it writes:

- ``tokenizer.json``: byte-level BPE trained on a procedural corpus (seeded word lists and templates:
  chat answers, reasoning, code, numbers, tool-call JSON), ChatML special tokens appended after the
  BPE vocabulary, no BOS added by the post-processor.
- ``tokenizer_config.json``: ``PreTrainedTokenizerFast`` settings and the chat template
  (``scripts/reference_corpus/chat_template.jinja``).
- ``config.json`` / ``generation_config.json``: a tiny Qwen3-shaped config (no weights exist).
- ``segments.json``: canonical token ids of generated sentences, list items, code blocks and tool
  calls, which ``eagle3_raw.reference.engine`` stitches together at serving time.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent.parent
CORPUS_DIR = Path(__file__).resolve().parent / "reference_corpus"
DEFAULT_OUT = ROOT / "eagle3_raw" / "reference" / "model"

SEED = 20261129
CORPUS_DOCUMENTS = 12_000
VOCAB_SIZE = 6144
CONTEXT_LENGTH = 4096
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# (content, special): like Qwen3, the think/tool tags are added tokens that decoding keeps.
ADDED_TOKENS = [
    (PAD, True),
    (IM_START, True),
    (IM_END, True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
]
# How many distinct texts of each kind the engine's segment library holds.
SEGMENT_COUNTS = {"think": 900, "answer": 900, "list_item": 300, "code": 150, "tool_call": 300}

SLOT = re.compile(r"\{([a-z_]+)\}")
TIMEZONES = ["UTC", "Europe/Paris", "Europe/London", "Asia/Tokyo", "America/New_York", "Australia/Sydney"]
PHRASES = ["{adj} {noun}", "{verb} the {noun}", "{noun} in {city}", "{adj} {topic}"]
EXTENSIONS = ["txt", "py", "json", "csv", "md", "yaml", "log"]


def load_lexicon(path: Path) -> dict[str, list[str]]:
    """Sections of ``lexicon.txt``: comma-separated words, or one template per line for ``t_*``."""
    sections: dict[str, list[str]] = {}
    name = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("## "):
            name = line[3:]
            sections[name] = []
        elif line and not line.startswith("#") and name:
            entries = [line] if name.startswith("t_") else line.split(",")
            sections[name] += [e.strip().replace("\\n", "\n") for e in entries if e.strip()]
    return sections


class TextGen:
    """Seeded generator of English-ish chat text, code, numbers and tool calls."""

    def __init__(self, lexicon: dict[str, list[str]], seed: int) -> None:
        self.lex = lexicon
        self.rng = random.Random(seed)
        self.tools = [self._parse_tool(line) for line in lexicon["t_tools"]]
        self.values: dict[str, Callable[[], str]] = {
            "num": lambda: str(self.number()),
            "small": lambda: str(self.rng.randint(1, 9)),
            "float": lambda: f"{self.rng.uniform(0, 1000):.{self.rng.randint(1, 3)}f}",
            "price": lambda: f"{self.pick(['$', '€', '£'])}{self.rng.randint(1, 999)}.{self.two_digits(99)}",
            "year": lambda: str(self.rng.randint(1900, 2030)),
            "temp": lambda: str(self.rng.randint(-10, 38)),
            "ident": self.ident,
            "pword": lambda: self.pseudo_word().capitalize(),
            "phrase": self.phrase,
            "sentence": lambda: self.fill(self.pick(self.lex["t_answer"])),
            "email": lambda: f"{self.pick(self.lex['name']).lower()}.{self.pseudo_word()}@example.com",
            "date": self.date,
            "clock": lambda: f"{self.two_digits(23)}:{self.pick(['00', '15', '30', '45'])}",
            "path": self.path,
            "expression": lambda: f"({self.number()} + {self.number()}) * {self.rng.randint(2, 9)}",
            "code_line": lambda: f"print(sum(range({self.number()})))",
            "timezone": lambda: self.pick(TIMEZONES),
            "unit_temp": lambda: self.pick(["celsius", "fahrenheit"]),
        }

    @staticmethod
    def _parse_tool(line: str) -> tuple[str, list[tuple[str, str]]]:
        name, _, args = line.partition("|")
        return name, [(a.split(":")[0].strip(), a.split(":")[1].strip()) for a in args.split(",")]

    def two_digits(self, high: int, low: int = 0) -> str:
        return f"{self.rng.randint(low, high):02d}"

    def date(self) -> str:
        return f"{self.rng.randint(2020, 2027)}-{self.two_digits(12, 1)}-{self.two_digits(28, 1)}"

    def path(self) -> str:
        return f"/home/{self.pick(self.lex['name']).lower()}/{self.ident()}.{self.pick(EXTENSIONS)}"

    def pick(self, items: list[str]) -> str:
        return items[self.rng.randrange(len(items))]

    def number(self) -> int:
        """Long-tailed non-negative integers (mostly small, some with many digits)."""
        return self.rng.randint(0, 10 ** self.rng.choice([1, 1, 2, 2, 2, 3, 3, 4, 5, 7]))

    def pseudo_word(self) -> str:
        return "".join(self.pick(self.lex["syllable"]) for _ in range(self.rng.randint(2, 3)))

    def ident(self) -> str:
        """A snake_case identifier made of verbs, nouns and pseudo-words."""
        parts = [self.pick(self.lex[self.pick(["verb", "noun", "noun", "syllable"])]) for _ in range(2)]
        return "_".join(parts[: self.rng.randint(1, 2)]).replace(" ", "_").lower()

    def phrase(self) -> str:
        return self.fill(self.pick(PHRASES))

    def slot(self, match: re.Match[str]) -> str:
        name = match.group(1)
        return self.values[name]() if name in self.values else self.pick(self.lex[name])

    def fill(self, template: str) -> str:
        """``template`` with every ``{slot}`` replaced (KeyError on an unknown slot)."""
        return SLOT.sub(self.slot, template)

    def sentence(self, kind: str) -> str:
        """One ``t_user``/``t_answer``/``t_think``/``t_list``/``t_code`` text, capitalized."""
        text = self.fill(self.pick(self.lex[kind]))
        return text[0].upper() + text[1:] if text[0].islower() else text

    def tool_arguments(self, args: list[tuple[str, str]]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, kind in args:
            if kind in ("num", "small"):
                values[name] = int(self.values[kind]())
            elif kind == "float":
                values[name] = float(self.values[kind]())
            elif kind == "bool":
                values[name] = self.rng.random() < 0.5
            else:
                values[name] = self.values[kind]() if kind in self.values else self.pick(self.lex[kind])
        return values

    def tool_call(self) -> str:
        """A ``{"name": ..., "arguments": {...}}`` object as the chat template's ``tojson`` writes it."""
        name, args = self.tools[self.rng.randrange(len(self.tools))]
        used = args[: self.rng.randint(1, len(args))]
        return json.dumps({"name": name, "arguments": self.tool_arguments(used)}, ensure_ascii=False)

    def tool_schema(self) -> str:
        """An OpenAI-style function definition, as rendered into a system prompt."""
        name, args = self.tools[self.rng.randrange(len(self.tools))]
        kinds = {"num": "integer", "small": "integer", "float": "number", "bool": "boolean"}
        props = {a: {"type": kinds.get(k, "string"), "description": self.phrase()} for a, k in args}
        params = {"type": "object", "properties": props, "required": [args[0][0]]}
        fn = {"name": name, "description": self.sentence("t_answer"), "parameters": params}
        return json.dumps({"type": "function", "function": fn}, ensure_ascii=False)

    def paragraph(self, kind: str, low: int, high: int) -> str:
        return " ".join(self.sentence(kind) for _ in range(self.rng.randint(low, high)))

    def document(self) -> str:
        """One training document: a chat transcript's text without the special tokens."""
        parts = ["system\nYou are a helpful assistant."]
        if self.rng.random() < 0.3:
            parts.append("<tools>\n" + "\n".join(self.tool_schema() for _ in range(self.rng.randint(1, 3))))
        parts += ["user\n" + self.sentence("t_user"), "assistant\n" + self.paragraph("t_think", 1, 6)]
        parts.append(self.paragraph("t_answer", 1, 5))
        roll = self.rng.random()
        if roll < 0.25:
            parts.append("\n".join(self.sentence("t_list") for _ in range(self.rng.randint(2, 6))))
        elif roll < 0.45:
            parts.append(self.sentence("t_code"))
        elif roll < 0.65:
            parts += [self.tool_call(), "tool\n" + json.dumps({"result": self.phrase(), "ok": True})]
        return "\n\n".join(parts)


def train_tokenizer(texts: list[str]) -> Tokenizer:
    """Byte-level BPE over ``texts`` (deterministic, whatever the thread count) plus the added tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(ADDED_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    if tokenizer.get_vocab_size() != VOCAB_SIZE - len(ADDED_TOKENS):
        raise RuntimeError(f"BPE stopped at {tokenizer.get_vocab_size()} tokens; the corpus is too small")
    added = [AddedToken(t, special=s, normalized=False) for t, s in ADDED_TOKENS]
    tokenizer.add_tokens(added)
    return tokenizer


def unique_texts(make: Callable[[], str], count: int) -> Iterator[str]:
    """``count`` distinct texts from ``make`` (in generation order)."""
    seen: set[str] = set()
    while len(seen) < count:
        text = make()
        if text not in seen:
            seen.add(text)
            yield text


def segment_library(tokenizer: Tokenizer, gen: TextGen) -> dict[str, Any]:
    """Canonical ids of every segment kind; sentences come as [ids at line start, ids after a space]."""

    def ids(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]

    makers: dict[str, Callable[[], str]] = {
        "think": lambda: gen.sentence("t_think"),
        "answer": lambda: gen.sentence("t_answer"),
        "list_item": lambda: gen.sentence("t_list"),
        "code": lambda: gen.sentence("t_code"),
        "tool_call": gen.tool_call,
    }
    library: dict[str, Any] = {}
    for kind, make in makers.items():
        texts = list(unique_texts(make, SEGMENT_COUNTS[kind]))
        library[kind] = ids(texts)
        if kind in ("think", "answer"):
            spaced = ids([" " + t for t in texts])
            library[kind] = [list(pair) for pair in zip(library[kind], spaced, strict=True)]
    glue = {"newline": "\n", "paragraph": "\n\n"}
    library["glue"] = {name: ids([text])[0] for name, text in glue.items()}
    return library


def tokenizer_config(tokenizer: Tokenizer, chat_template: str) -> dict[str, Any]:
    flags = ("lstrip", "normalized", "rstrip", "single_word", "special")
    decoder = {
        str(token_id): {"content": token.content, **{flag: getattr(token, flag) for flag in flags}}
        for token_id, token in tokenizer.get_added_tokens_decoder().items()
    }
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": CONTEXT_LENGTH,
        "pad_token": PAD,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def model_config(eos_id: int, pad_id: int) -> dict[str, Any]:
    """A tiny Qwen3-shaped config: loadable by ``AutoConfig``; no weights exist for it."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "dtype": "float32",
        "eos_token_id": eos_id,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 128,
        "max_position_embeddings": CONTEXT_LENGTH,
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "pad_token_id": pad_id,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "vocab_size": VOCAB_SIZE,
    }


def write_json(path: Path, obj: Any, *, compact: bool = False) -> None:
    """Stable JSON: sorted keys, UTF-8, trailing newline; ``compact`` for the large files."""
    text = json.dumps(
        obj,
        ensure_ascii=False,
        sort_keys=True,
        indent=None if compact else 2,
        separators=(",", ":") if compact else None,
    )
    path.write_text(text + "\n", encoding="utf-8")


def build(out_dir: Path) -> None:
    """Write every model file into ``out_dir`` (created if missing)."""
    lexicon = load_lexicon(CORPUS_DIR / "lexicon.txt")
    corpus_gen = TextGen(lexicon, SEED)
    tokenizer = train_tokenizer([corpus_gen.document() for _ in range(CORPUS_DOCUMENTS)])
    eos_id, pad_id = tokenizer.token_to_id(IM_END), tokenizer.token_to_id(PAD)
    chat_template = (CORPUS_DIR / "chat_template.jinja").read_text(encoding="utf-8")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "tokenizer.json", json.loads(tokenizer.to_str()), compact=True)
    write_json(out_dir / "tokenizer_config.json", tokenizer_config(tokenizer, chat_template))
    write_json(out_dir / "config.json", model_config(eos_id, pad_id))
    write_json(out_dir / "generation_config.json", {"eos_token_id": eos_id, "pad_token_id": pad_id})
    library = segment_library(tokenizer, TextGen(lexicon, SEED + 1))
    write_json(out_dir / "segments.json", library, compact=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    build(parser.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
