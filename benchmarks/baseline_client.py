"""A baseline client built the way today's regeneration scripts are, for comparison with eagle3_raw.

Modelled on the usual pattern (e.g. SpecForge's ``scripts/regenerate_train_data.py``): a
``concurrent.futures.ThreadPoolExecutor`` with ``concurrency x endpoints`` workers; requests go to
the endpoints in strict round-robin; the main thread keeps at most ``concurrency`` futures per
endpoint and, when the next endpoint in turn is full, waits for one of *that endpoint's* requests to
finish (even if another endpoint is idle), writing finished results to a JSONL file as it goes. Each
request is one blocking HTTP POST on a new connection (as ``requests.post`` or a client made per
call does; stdlib ``urllib.request`` here, so no new dependency), decoded with the stdlib ``json``.
No retries, no in-flight limit derived from the server.

Kinder than the scripts it stands for, so the comparison is not rigged: it sends exactly the
requests eagle3_raw sends (``input_ids`` and ``sampling_params``, seeds included, planned by
eagle3_raw's own planner from the same recipe, all before the first request), and it waits on
``concurrent.futures.wait`` where SpecForge's script spins on ``future.done()``.

With ``--protocol vllm`` it speaks vLLM's token route instead of SGLang's ``/generate``: the same
ids and sampling, renamed to vLLM's ``SamplingParams`` (:func:`vllm_body`), POSTed to
``/inference/v1/generate``.

Run alone: ``python benchmarks/baseline_client.py --recipe r.yaml --concurrency 64 --out out.jsonl``;
it prints one JSON line of counters (requests, generated tokens, errors, wall and CPU seconds).
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO


@dataclass(frozen=True)
class Request:
    """One row to generate: the same body eagle3_raw would send (minus its ``rid``)."""

    row_id: str
    input_ids: list[int]
    sampling_params: dict[str, Any]


def plan_requests(recipe_source: Any) -> tuple[list[Request], list[str]]:
    """The recipe's requests in canonical order, and its endpoints (eagle3_raw's planner, rendering
    locally for the reference server's target, with an empty journal)."""
    import dataclasses
    import tempfile

    import numpy as np

    from eagle3_raw.journal.generations import GenerationIndex
    from eagle3_raw.recipe import load_recipe
    from eagle3_raw.run.plan import Job, KeySet, Planner, Shard
    from eagle3_raw.run.render import Renderer
    from eagle3_raw.run.target import reference_target
    from eagle3_raw.source.prompts import iter_conversations

    recipe = load_recipe(recipe_source)
    target = dataclasses.replace(reference_target([]), render="local")
    with tempfile.TemporaryDirectory(prefix="baseline-plan-") as empty:
        index = GenerationIndex(Path(empty))
        nothing = KeySet(np.zeros(0, np.int64))
        planner = Planner(recipe, Renderer(recipe), target, shard=Shard(), exclude=nothing, index=index)
        jobs = list(planner.plan(iter_conversations(recipe)))
    requests = [Request(j.row_id, j.prompt_ids, j.sampling_params) for j in jobs if isinstance(j, Job)]
    return requests, list(recipe.server.endpoints)


# SGLang's sampling names that vLLM's SamplingParams spells otherwise (the rest are the same).
VLLM_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "sampling_seed": "seed"}


SGLANG_TOP_K_ALL = 1 << 30  # SGLang's "no top-k" (its TOP_K_ALL); vLLM's is 0


def vllm_body(request: Request) -> dict[str, Any]:
    """The ``/inference/v1/generate`` body for the same ids and sampling."""
    params = {VLLM_NAMES.get(key, key): value for key, value in request.sampling_params.items()}
    if params.get("top_k", 0) >= SGLANG_TOP_K_ALL:
        params["top_k"] = 0
    return {"token_ids": request.input_ids, "sampling_params": params}


def _post(url: str, body: dict[str, Any], timeout: float) -> Any:
    http = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(http, timeout=timeout) as response:
        return json.loads(response.read())


def generate(url: str, request: Request, timeout: float, protocol: str = "sglang") -> dict[str, Any]:
    """POST one request (``/generate``, or vLLM's ``/inference/v1/generate``); the result row, or an
    ``error`` entry."""
    try:
        if protocol == "vllm":
            choice = _post(f"{url}/inference/v1/generate", vllm_body(request), timeout)["choices"][0]
            output, finish = choice.get("token_ids") or [], choice.get("finish_reason")
        else:
            body = {"input_ids": request.input_ids, "sampling_params": request.sampling_params}
            result = _post(f"{url}/generate", body, timeout)
            output, finish = result.get("output_ids", []), result.get("meta_info", {}).get("finish_reason")
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as exc:
        return {"id": request.row_id, "status": "error", "error": str(exc)}
    return {"id": request.row_id, "status": "success", "input_ids": request.input_ids,
            "output_ids": output, "finish_reason": finish}  # fmt: skip


@dataclass
class Counters:
    requests: int = 0
    generated_tokens: int = 0
    errors: int = 0


def _write(future: Future[dict[str, Any]], out: TextIO, counters: Counters) -> None:
    row = future.result()
    out.write(json.dumps(row) + "\n")
    counters.requests += 1
    if row["status"] == "success":
        counters.generated_tokens += len(row["output_ids"])
    else:
        counters.errors += 1


def run_baseline(
    requests: Sequence[Request],
    endpoints: Sequence[str],
    concurrency: int,
    out: TextIO,
    timeout: float = 600.0,
    protocol: str = "sglang",
) -> Counters:
    """Send every request as described in the module docstring; return the counters."""
    counters = Counters()
    waiting: dict[str, list[Future[dict[str, Any]]]] = {url: [] for url in endpoints}
    with ThreadPoolExecutor(max_workers=concurrency * len(endpoints)) as pool:
        for i, request in enumerate(requests):
            url = endpoints[i % len(endpoints)]
            while len(waiting[url]) >= concurrency:
                done, _ = wait(waiting[url], return_when=FIRST_COMPLETED)
                for future in done:
                    _write(future, out, counters)
                    waiting[url].remove(future)
            waiting[url].append(pool.submit(generate, url, request, timeout, protocol))
        for futures in waiting.values():
            for future in futures:
                _write(future, out, counters)
    return counters


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", required=True, help="recipe YAML (its endpoints and sampling are used)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight per endpoint")
    parser.add_argument("--out", type=Path, required=True, help="JSONL file for the generated rows")
    parser.add_argument("--protocol", choices=("sglang", "vllm"), default="sglang",
                        help="SGLang's /generate, or vLLM's /inference/v1/generate")  # fmt: skip
    args = parser.parse_args(argv)
    start = time.perf_counter()
    requests, endpoints = plan_requests(args.recipe)
    planned = time.perf_counter()
    cpu = time.process_time()
    with args.out.open("w") as out:
        counters = run_baseline(requests, endpoints, args.concurrency, out, protocol=args.protocol)
    print(json.dumps({
        "requests": counters.requests, "generated_tokens": counters.generated_tokens,
        "errors": counters.errors, "plan_seconds": planned - start,
        "run_seconds": time.perf_counter() - planned, "run_cpu_seconds": time.process_time() - cpu,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
