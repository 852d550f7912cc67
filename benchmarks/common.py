"""Helpers shared by the client benchmarks: prompt files, recipes, isolated caches, the reference
server's stats, process CPU time, tables.

The benchmarks run as scripts (``python benchmarks/bench_x.py``), so this module is imported as
``common`` from the ``benchmarks`` folder. Nothing here changes what eagle3_raw does.
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

_TOPICS = (
    "sorting a list", "the weather in Oslo", "compound interest", "a JSON schema", "sourdough bread",
    "TCP congestion control", "photosynthesis", "binary search", "the French Revolution", "hash tables",
    "plate tectonics", "Rust lifetimes", "SQL joins", "the Krebs cycle", "Bayes' theorem", "git rebase",
)  # fmt: skip
_ASKS = (
    "Explain {t} to a beginner.", "Write a short essay about {t}.", "Give three facts about {t}.",
    "Compare {t} with something similar.", "Write Python code related to {t}.",
    "What are common mistakes with {t}?", "Summarize {t} in one paragraph.",
)  # fmt: skip


def write_prompts(path: Path, count: int, seed: int = 0) -> Path:
    """A JSONL file of ``count`` plain prompts (``{"id", "prompt"}``), distinct and deterministic."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for i in range(count):
            text = f"Q{i}: " + rng.choice(_ASKS).format(t=rng.choice(_TOPICS))
            f.write(json.dumps({"id": f"p{i:07d}", "prompt": text}) + "\n")
    return path


def read_recipe(path: Path) -> dict[str, Any]:
    """A recipe file written by :func:`write_recipe`, as a mapping."""
    import yaml

    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def bench_recipe(
    prompts: Path,
    endpoints: Sequence[str],
    *,
    max_new_tokens: int,
    ignore_eos: bool = False,
    temperature: float = 0.7,
    thinking: bool = True,
    max_in_flight: int | None = None,
    name: str = "bench",
) -> dict[str, Any]:
    """A recipe (as a mapping) over ``prompts`` with the reference tokenizer, one sample per prompt."""
    sampling: dict[str, Any] = {"max_new_tokens": max_new_tokens, "temperature": temperature, "seed": 0}
    if ignore_eos:
        sampling["ignore_eos"] = True
    server: dict[str, Any] = {"endpoints": list(endpoints)}
    if max_in_flight is not None:
        server["max_in_flight"] = max_in_flight
    return {
        "name": name,
        "prompts": {"source": str(prompts), "format": "prompt", "id_column": "id"},
        "model": {"tokenizer": "reference", "chat_template_kwargs": {"enable_thinking": thinking}},
        "server": server,
        "sampling": sampling,
    }


def write_recipe(path: Path, recipe: Mapping[str, Any]) -> Path:
    """Write ``recipe`` as YAML (JSON is YAML), for ``eagle3-raw build`` or a client subprocess."""
    path.write_text(json.dumps(recipe, indent=1))
    return path


def isolated_env(root: Path) -> dict[str, str]:
    """Environment variables that keep every cache, journal and Hub access inside ``root``, offline."""
    return {
        "HF_HOME": str(root / "hf"),
        "HF_DATASETS_CACHE": str(root / "hf" / "datasets"),
        "EAGLE3_RAW_JOURNAL_DIR": str(root / "journals"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "TOKENIZERS_PARALLELISM": "false",
    }


def run_json_child(command: Sequence[str], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run a child process that prints one JSON object on its last stdout line; return it."""
    full_env = {**os.environ, **(env or {})}
    result = subprocess.run(list(command), capture_output=True, text=True, env=full_env)
    if result.returncode != 0:
        raise RuntimeError(f"{command[:4]} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


# --- the reference server's side endpoints ---------------------------------------------------


def http_json(url: str, *, method: str = "GET", timeout: float = 10.0) -> Any:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()
    return json.loads(body) if body.strip().startswith((b"{", b"[")) else body.decode()


def reset_server(url: str, cache_route: str = "/flush_cache") -> None:
    """Empty the prefix cache and zero the stats (busy-slot integral, wall clock, counters); a
    vLLM-mode reference server empties its cache on ``/reset_prefix_cache`` (dev mode)."""
    http_json(f"{url}{cache_route}", method="POST")
    http_json(f"{url}/reference/stats/reset", method="POST")


@dataclass
class Poller:
    """Snapshots of every server's ``GET /reference/stats``, one tick every ``interval`` seconds,
    from a thread. A tick's time is this process's ``time.monotonic()`` (the same clock in every
    process on Linux) at the midpoint of its requests."""

    urls: Sequence[str]
    interval: float = 0.02
    ticks: list[tuple[float, list[dict[str, Any]]]] = field(default_factory=list)

    def __enter__(self) -> Poller:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._tick()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._tick()
            self._stop.wait(self.interval)

    def _tick(self) -> None:
        before = time.monotonic()
        snaps = [http_json(f"{url}/reference/stats") for url in self.urls]
        self.ticks.append(((before + time.monotonic()) / 2, snaps))

    def series(self, key: str) -> list[float]:
        """``key`` summed over the servers, per tick."""
        return [float(sum(s[key] or 0 for s in snaps)) for _, snaps in self.ticks]

    def start_index(self) -> int:
        """The last tick before the servers saw their first ``/generate`` (where a window starts)."""
        sent = self.series("generate_requests")
        return max(0, next(i for i, n in enumerate(sent) if n > 0) - 1)

    def times(self) -> list[float]:
        return [t for t, _ in self.ticks]


# --- processes ---------------------------------------------------------------------------------


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process (all its threads), from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def machine_busy_seconds() -> float:
    """CPU seconds spent by every process on the machine since boot (``/proc/stat``, all cores).

    The difference over a run, minus what the benchmark's own processes used, is what other
    processes took from the cores meanwhile: the numbers are only clean when it is near zero.
    """
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def self_cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's children that have exited and been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class CpuAccount:
    """CPU seconds over a block: the reference servers', the finished child clients', this process's,
    and everyone else's on the machine (``others``: other users' work competing for the cores)."""

    def __init__(self, server_pids: Sequence[int]) -> None:
        self.server_pids = list(server_pids)

    def _now(self) -> tuple[float, float, float, float]:
        servers = sum(process_cpu_seconds(pid) for pid in self.server_pids)
        return machine_busy_seconds(), servers, children_cpu_seconds(), self_cpu_seconds()

    def __enter__(self) -> CpuAccount:
        self._start = self._now()
        return self

    def __exit__(self, *exc_info: object) -> None:
        busy, servers, children, me = (b - a for a, b in zip(self._start, self._now(), strict=True))
        self.servers, self.clients, self.parent = servers, children, me
        self.others = max(0.0, busy - servers - children - me)


def status_mb() -> dict[str, float]:
    """The ``kB`` lines of ``/proc/self/status`` (VmRSS, VmHWM, ...), in MiB."""
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            values[key] = int(rest.split()[0]) / 1024
    return values


def peak_rss_mb() -> dict[str, float]:
    """This process's peak RSS: ``VmHWM`` from ``/proc/self/status`` and ``ru_maxrss`` (MiB)."""
    hwm = status_mb().get("VmHWM", 0.0)
    return {"vmhwm_mb": hwm, "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def machine() -> str:
    """One line about where the numbers come from."""
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), "unknown CPU",
    )  # fmt: skip
    return f"{os.cpu_count()} cores ({model}), Python {sys.version.split()[0]}"


# --- output ------------------------------------------------------------------------------------


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain, right-aligned text table (first column left-aligned)."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    line = [
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(columns, widths, strict=True))
    ]
    print("  ".join(line))
    for row in cells:
        print(
            "  ".join(
                v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True))
            )
        )


def cell(value: Any, digits: int = 3) -> str:
    """A table cell: ``n/a`` for None, thousands separators, ``digits`` decimals below 10."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.{digits}f}" if abs(value) < 10 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def write_json(path: str | Path | None, data: Any) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=2, default=str) + "\n")
