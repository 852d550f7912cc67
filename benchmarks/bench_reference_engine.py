"""Throughput of the reference engine on one core (no server, no latency).

Usage: ``python benchmarks/bench_reference_engine.py [--prompts 2000] [--max-new-tokens 4096]``.
Prints the engine load time, then one row per sampling setup: prompts, mean output length and
output tokens per second. The engine must never be a client benchmark's bottleneck (target: at
least 200k tokens/s).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from eagle3_raw.reference.engine import EngineParams, ReferenceEngine
from eagle3_raw.reference.model_files import load_raw_tokenizer

TOPICS = ["sorting a list", "the weather in Oslo", "17 * 23", "a JSON schema", "sourdough bread", "TCP"]


def make_prompts(count: int) -> list[list[int]]:
    """ChatML prompts; every third one disables thinking, every other one offers tools."""
    tokenizer = load_raw_tokenizer()
    texts = []
    for i in range(count):
        system = "# Tools\n<tools>\n{}\n</tools>\n<tool_call>\n</tool_call>" if i % 2 else "Be helpful."
        user = f"Question {i}: tell me about {TOPICS[i % len(TOPICS)]}."
        think = "<think>\n\n</think>\n\n" if i % 3 == 0 else ""
        texts.append(
            f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n{think}"
        )
    return [encoding.ids for encoding in tokenizer.encode_batch(texts)]


def setups(max_new_tokens: int) -> dict[str, EngineParams]:
    base = EngineParams(max_new_tokens=max_new_tokens, sampling_seed=0)
    return {
        "greedy": replace(base, temperature=0.0),
        "T=1": base,
        "T=0.7 top_p/top_k/min_p": replace(base, temperature=0.7, top_p=0.9, top_k=20, min_p=0.05),
        "T=0.7 + penalties": replace(base, temperature=0.7, frequency_penalty=0.5, repetition_penalty=1.1),
        "ignore_eos": replace(base, ignore_eos=True),
    }


def run(engine: ReferenceEngine, prompts: list[list[int]], params: EngineParams) -> tuple[float, float]:
    """(mean output length, output tokens per second) over ``prompts``."""
    start = time.perf_counter()
    total = sum(len(engine.generate(ids, params).output_ids) for ids in prompts)
    return total / len(prompts), total / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--max-new-tokens", type=int, default=4096)
    args = parser.parse_args()
    start = time.perf_counter()
    engine = ReferenceEngine()
    print(f"engine load: {(time.perf_counter() - start) * 1000:.0f} ms")
    prompts = make_prompts(args.prompts)
    print(f"{'setup':<26} {'prompts':>8} {'mean len':>9} {'tokens/s':>12}")
    for name, params in setups(args.max_new_tokens).items():
        mean, rate = run(engine, prompts, params)
        print(f"{name:<26} {len(prompts):>8} {mean:>9.0f} {rate:>12,.0f}")


if __name__ == "__main__":
    main()
