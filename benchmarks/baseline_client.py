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
    """The recipe's requests in canonical order, and its endpoints (eagle3_raw's planner)."""
    from eagle3_raw.recipe import load_recipe
    from eagle3_raw.run.plan import Job, Limits, Shard, plan_jobs
    from eagle3_raw.run.render import Renderer
    from eagle3_raw.source.prompts import iter_conversations

    recipe = load_recipe(recipe_source)
    jobs = plan_jobs(iter_conversations(recipe), Renderer(recipe), recipe,
                     shard=Shard(), exclude=set(), limits=Limits())  # fmt: skip
    requests = [Request(j.row_id, j.prompt_ids, j.sampling_params) for j in jobs if isinstance(j, Job)]
    return requests, list(recipe.server.endpoints)


def generate(url: str, request: Request, timeout: float) -> dict[str, Any]:
    """POST one request to ``/generate``; the result row, or an ``error`` entry."""
    body = json.dumps({"input_ids": request.input_ids, "sampling_params": request.sampling_params})
    http = urllib.request.Request(
        f"{url}/generate", data=body.encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(http, timeout=timeout) as response:
            result = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return {"id": request.row_id, "status": "error", "error": str(exc)}
    meta = result.get("meta_info", {})
    return {
        "id": request.row_id, "status": "success", "input_ids": request.input_ids,
        "output_ids": result.get("output_ids", []), "finish_reason": meta.get("finish_reason"),
    }  # fmt: skip


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
            waiting[url].append(pool.submit(generate, url, request, timeout))
        for futures in waiting.values():
            for future in futures:
                _write(future, out, counters)
    return counters


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", required=True, help="recipe YAML (its endpoints and sampling are used)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight per endpoint")
    parser.add_argument("--out", type=Path, required=True, help="JSONL file for the generated rows")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    requests, endpoints = plan_requests(args.recipe)
    planned = time.perf_counter()
    cpu = time.process_time()
    with args.out.open("w") as out:
        counters = run_baseline(requests, endpoints, args.concurrency, out)
    print(json.dumps({
        "requests": counters.requests, "generated_tokens": counters.generated_tokens,
        "errors": counters.errors, "plan_seconds": planned - start,
        "run_seconds": time.perf_counter() - planned, "run_cpu_seconds": time.process_time() - cpu,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
