"""``eagle3-raw ray`` (issue 16): the shards as tasks on Ray's local cluster (``ray.init``, two
CPUs), each launching its own server (the reference server standing in for SGLang) through the
launcher, then the merge; the merged set equals a single-process build.

Ray is the optional ``ray`` extra: CI installs it (the README's test command has ``.[test,ray]``);
where it is not installed this module is skipped, saying so.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import eagle3_raw
from eagle3_raw.cluster.ray_runner import RayShards, run_on_ray
from eagle3_raw.errors import FatalError
from tests.helpers import generations, ledgers_in, rid_row_id, sglang_section, write_prompts, write_recipe
from tests.support.pace import scaled

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (CI installs it)")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_shards_as_ray_tasks_each_with_its_server_merge_into_the_single_build(
    tmp_path: Path, local_ray: Any
) -> None:
    write_prompts(tmp_path, 24)
    server = sglang_section(tmp_path / "ledgers", "--slots", "4", "--ms-per-token", "1", stop_timeout=5)
    recipe = write_recipe(tmp_path, endpoints=[], server=server, sampling={"max_new_tokens": 32})
    spec = RayShards(recipe=str(recipe), shards=2, journal_dir=tmp_path / "journals", num_cpus=1)
    result = run_on_ray(spec, cache_dir=tmp_path / "cache")
    assert sorted(t["shard"] for t in result.tasks) == ["0-of-2", "1-of-2"]
    assert all("eagle3_raw's Ray runner (EAGLE3_RAW_RAY_SHARD=" in t["source"] for t in result.tasks)
    assert sum(t["new_rows"] for t in result.tasks) == 24
    ledgers = ledgers_in(tmp_path / "ledgers")
    assert len(ledgers) == 2  # one server per task
    asked = [{rid_row_id(g["rid"]) for g in generations(ledger)} for ledger in ledgers]
    assert not asked[0] & asked[1] and len(asked[0] | asked[1]) == 24  # each its own shard, once
    assert result.built is not None and result.built.run_result is not None
    merged = result.built.dataset
    clean = eagle3_raw.load(str(recipe), cache_dir=str(tmp_path / "clean"), journal_dir=tmp_path / "clean-j")
    assert merged["id"] == clean["id"] and merged["input_ids"] == clean["input_ids"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_shard_that_fails_on_ray_is_one_clear_error(tmp_path: Path, local_ray: Any) -> None:
    write_prompts(tmp_path, 4)
    server = sglang_section(tmp_path / "ledgers", "--slots", "0", "--ms-per-token", "1")  # will not start
    recipe = write_recipe(tmp_path, endpoints=[], server=server)
    spec = RayShards(recipe=str(recipe), shards=2, journal_dir=tmp_path / "journals", max_retries=0)
    with pytest.raises(
        FatalError, match=r"(?s)shard 0 failed on Ray: the SGLang server exited.*--slots must be at least 1"
    ):
        run_on_ray(spec)


@pytest.mark.slow
def test_the_cli_needs_ray_only_for_ray(tmp_path: Path) -> None:
    """``import eagle3_raw`` and every other command never import Ray."""
    code = "import sys, eagle3_raw, eagle3_raw.cli.main as c; c.build_parser(); print('ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(60))
    assert done.stdout.strip() == "False", done.stderr
