#!/usr/bin/env python3
"""Prove the hand-off with the trainers' own code: the demo set's exports fed to SpecForge 0.2.0,
speculators 0.9.0 and Model-Optimizer 0.47.0, each in its own environment, on CPU.

    python scripts/prove_trainers.py [--work-dir DIR] [--venvs DIR] [--max-length 256] [--size 1024]

Run it from the repo's environment (``pip install -e ".[test]"``: it starts the test Hub server).
The trainers cannot share an environment with eagle3_raw (speculators pins datasets <= 5.1.0 and
transformers <= 5.19.0; SpecForge pins transformers 5.8.1 and torch 2.11.0), so each gets a venv
under ``--venvs`` (default ``~/.cache/eagle3_raw/trainers``), made once and reused:

- speculators: ``speculators==0.9.0 torch==2.13.0`` with their dependencies, then torchvision and
  torchaudio removed (PyPI's builds do not load with the CPU torch and break ``import
  transformers``; speculators' data and vocabulary code does not use them);
- SpecForge: ``specforge==0.2.0`` without dependencies, plus what its data, config and draft code
  imports (``torch==2.13.0``, ``transformers==5.8.1``, ...). Not its pinned torch 2.11.0 (only a
  CUDA build on PyPI) nor sglang 0.5.14 (the GPU capture server, not run here);
- Model-Optimizer: ``nvidia-modelopt==0.47.0 torch==2.13.0`` and what its EAGLE plugin imports.

``torch==2.13.0`` resolves to a local CPU wheel where there is one. Checks (each compares what the
trainer's code produced with the set itself or with eagle3_raw's report, never with itself):

1. SpecForge's pre-tokenized reader takes every row unchanged and whole; at ``--max-length`` it
   keeps exactly the rows eagle3_raw's truncated export holds (its silent drops are the reported
   ones); the boundary variant arrives as written; the mapping passes SpecForge's consistency check,
   loads into an EAGLE-3 draft built by SpecForge's own code; ``specforge train --plan`` validates
   the online config with the mapping and refuses it without.
2. speculators ``prepare-data`` takes the export folder and the published set (``hf:``, from the
   test Hub server) unchanged and whole, cuts at ``--seq-length`` exactly as reported, writes the
   same ``token_freq.pt`` as ours; ``train``'s own vocabulary code loads our ``d2t``/``t2d``,
   rebuilds the same from ``token_freq.pt``, and falls back to the full vocabulary without
   ``--no-skip-token-freq``.
3. Model-Optimizer's ``load_draft_vocab_cache`` loads our ``d2t-N.pt``.

It prints a summary and writes ``summary.json`` into ``--work-dir``; exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHECKS = Path(__file__).resolve().parent / "trainer_checks"
sys.path.insert(0, str(ROOT))  # tests.support.hub_server


@dataclass(frozen=True)
class Venv:
    name: str
    install: tuple[str, ...]
    no_deps: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()

    def python(self, root: Path) -> Path:
        return root / self.name / "bin" / "python"


SPECULATORS = Venv(
    "speculators-0.9.0", ("speculators==0.9.0", "torch==2.13.0"), remove=("torchvision", "torchaudio")
)
SPECFORGE = Venv(
    "specforge-0.2.0",
    (
        "torch==2.13.0",
        "transformers==5.8.1",
        "datasets",
        "pydantic",
        "pyyaml",
        "numpy",
        "safetensors",
        "huggingface-hub",
        "tqdm",
        "accelerate",
        "psutil",
        "requests",
    ),
    no_deps=("specforge==0.2.0",),
)
MODELOPT = Venv(
    "modelopt-0.47.0", ("nvidia-modelopt==0.47.0", "torch==2.13.0", "transformers", "requests", "datasets")
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache/eagle3_raw/prove_trainers")
    parser.add_argument("--venvs", type=Path, default=Path.home() / ".cache/eagle3_raw/trainers")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--size", type=int, default=1024, help="draft vocabulary size")
    args = parser.parse_args(argv)
    started = time.monotonic()
    pythons = {v.name: ensure_venv(v, args.venvs) for v in (SPECULATORS, SPECFORGE, MODELOPT)}
    work = args.work_dir
    rows = build_demo(work)
    exports = make_exports(work, args.max_length, args.size)
    expect = write_expectations(work, rows, args.max_length)
    results = {
        "report_matches_the_set": report_matches(rows, exports["specforge_cut"].lengths, args.max_length),
        "set": {
            "rows": len(rows),
            "generated_tokens": sum(len(r["input_ids"]) - r["prompt_len"] for r in rows),
            "longest": max(len(r["input_ids"]) for r in rows),
        },
        "reports": {name: report(result) for name, result in exports.items()},
        "specforge": prove_specforge(pythons[SPECFORGE.name], work, exports, expect, args),
        "speculators": prove_speculators(pythons[SPECULATORS.name], work, exports, expect, args),
        "modelopt": run_check(
            pythons[MODELOPT.name],
            "modelopt_check.py",
            work / "modelopt.json",
            {
                "d2t": str(exports["modelopt"].output_dir / f"d2t-{args.size}.pt"),
                "size": args.size,
                "vocab_size": 6144,
            },
        ),
    }
    results["seconds"] = round(time.monotonic() - started)
    (work / "summary.json").write_text(json.dumps(results, indent=2) + "\n")
    failures = list(failed(results))
    print(render(results, failures))
    return 1 if failures else 0


# --- environments ------------------------------------------------------------------------------------


def ensure_venv(venv: Venv, root: Path) -> Path:
    """The venv's python, created and installed once (a marker file records what was installed)."""
    python, marker = venv.python(root), root / venv.name / "eagle3_raw-installed.json"
    wanted = json.dumps({"install": venv.install, "no_deps": venv.no_deps, "remove": venv.remove})
    if python.is_file() and marker.is_file() and marker.read_text() == wanted:
        return python
    log(f"creating {root / venv.name} (minutes, once)")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(root / venv.name)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, *venv.install], check=True)
    if venv.no_deps:
        subprocess.run([*pip, "--no-deps", *venv.no_deps], check=True)
    if venv.remove:
        subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", *venv.remove], check=True)
    marker.write_text(wanted)
    return python


# --- the set and its exports ---------------------------------------------------------------------------


def run_options(work: Path) -> dict[str, Any]:
    return {"journal_dir": work / "journals", "progress": "none"}


def build_demo(work: Path) -> list[dict[str, Any]]:
    import eagle3_raw

    log("building the demo set (the reference server; reused from the cache after the first run)")
    rows = eagle3_raw.load("demo", cache_dir=str(work / "cache"), **run_options(work))
    return list(rows.select_columns(["id", "input_ids", "loss_mask", "prompt_len"]))


def make_exports(work: Path, max_length: int, size: int) -> dict[str, Any]:
    from eagle3_raw.export import export

    shutil.rmtree(work / "exports", ignore_errors=True)  # ours; an export refuses a folder it did not make

    plans: dict[str, dict[str, Any]] = {
        "specforge": {"layout": "specforge"},
        "specforge_cut": {"layout": "specforge", "max_length": max_length},
        "specforge_boundary": {"layout": "specforge", "extend_boundary": True},
        "speculators": {"layout": "speculators"},
        "speculators_cut": {"layout": "speculators", "max_length": max_length},
        "modelopt": {"layout": "modelopt"},
        "jsonl": {"layout": "jsonl"},
    }
    done = {}
    for name, options in plans.items():
        done[name] = export(
            recipe="demo",
            output_dir=work / "exports" / name,
            cache_dir=work / "cache",
            run_options=run_options(work),
            draft_vocab_sizes=[size],
            **options,
        )
    print(done["specforge_cut"].render())
    return done


def write_expectations(work: Path, rows: list[dict[str, Any]], max_length: int) -> dict[str, Path]:
    """What each trainer must end up with, from the set's rows (not from the export code)."""
    folder = work / "expect"
    folder.mkdir(parents=True, exist_ok=True)
    cut = [(r["input_ids"][:max_length], r["loss_mask"][:max_length]) for r in rows]
    boundary = [
        (r["input_ids"], [*r["loss_mask"][: r["prompt_len"] - 1], 1, *r["loss_mask"][r["prompt_len"] :]])
        for r in rows
    ]
    cases = {
        "full": [(r["input_ids"], r["loss_mask"]) for r in rows],
        "cut": [(ids, mask) for ids, mask in cut if sum(mask) >= 1],
        "boundary": boundary,
    }
    paths = {}
    for name, pairs in cases.items():
        paths[name] = folder / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps({"input_ids": i, "loss_mask": m}) + "\n" for i, m in pairs))
    return paths


def report_matches(rows: list[dict[str, Any]], lengths: Any, max_length: int) -> dict[str, bool]:
    """eagle3_raw's length report against a count made here from the rows."""
    kept = [sum(r["loss_mask"][:max_length]) for r in rows]
    total = [sum(r["loss_mask"]) for r in rows]
    over = [len(r["input_ids"]) > max_length for r in rows]
    return {
        "rows_over": lengths.rows_over == sum(over),
        "truncate_rows_dropped": lengths.truncate.rows_dropped == sum(k == 0 for k in kept),
        "truncate_supervised_lost": lengths.truncate.supervised_lost == sum(total) - sum(kept),
        "drop_supervised_lost": lengths.drop.supervised_lost
        == sum(t for t, o in zip(total, over, strict=True) if o),
    }


def report(result: Any) -> dict[str, Any]:
    lengths = result.lengths
    return {
        "rows_written": result.rows_written,
        "supervised_tokens": result.supervised_tokens,
        "lengths": None
        if lengths is None
        else {
            "max_length": lengths.max_length,
            "applied": lengths.applied,
            "rows_over": lengths.rows_over,
            "truncate": vars(lengths.truncate),
            "drop": vars(lengths.drop),
        },
        "coverage": {str(size): round(share, 4) for size, share in result.coverage()},
    }


# --- SpecForge -----------------------------------------------------------------------------------------


def prove_specforge(
    python: Path, work: Path, exports: Mapping[str, Any], expect: Mapping[str, Path], args: argparse.Namespace
) -> dict[str, Any]:
    log("SpecForge 0.2.0: reader, mapping, draft, config")
    longest = exports["specforge"].longest_row
    files = {
        name: str(exports[name].data_file) for name in ("specforge", "specforge_cut", "specforge_boundary")
    }
    mapping = exports["specforge"].output_dir / f"vocab_mapping-{args.size}.pt"
    config = specforge_config(work, files["specforge"], longest, mapping, args.size)
    cases = {
        "whole": {"file": files["specforge"], "max_length": longest, "expect": str(expect["full"])},
        "its_own_cut": {
            "file": files["specforge"],
            "max_length": args.max_length,
            "expect": str(expect["cut"]),
        },
        "our_cut": {
            "file": files["specforge_cut"],
            "max_length": args.max_length,
            "expect": str(expect["cut"]),
        },
        "boundary": {
            "file": files["specforge_boundary"],
            "max_length": longest,
            "expect": str(expect["boundary"]),
        },
    }
    checked = run_check(
        python,
        "specforge_check.py",
        work / "specforge.json",
        {
            "cases": cases,
            "mapping": str(mapping),
            "size": args.size,
            "vocab_size": 6144,
            "config": str(config),
            "token_freq": str(exports["specforge"].output_dir / "token_freq.pt"),
        },
    )
    checked["plan"] = specforge_plan(python, config, with_mapping=True)
    without = config.with_name("online-no-mapping.yaml")
    online = yaml.safe_load(config.read_text())
    del online["model"]["vocab_mapping_path"]
    without.write_text(yaml.safe_dump(online, sort_keys=False))
    checked["plan_without_mapping"] = specforge_plan(python, without, with_mapping=False)
    return checked


def specforge_config(work: Path, data: str, max_length: int, mapping: Path, size: int) -> Path:
    """An online (disaggregated) EAGLE-3 config on the reference model, and its draft config."""
    from eagle3_raw.resources import reference_model_dir

    target = json.loads((reference_model_dir() / "config.json").read_text())
    draft = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "draft_vocab_size": size,
        "pad_token_id": 0,
        "max_position_embeddings": 4096,
        **{
            k: target[k]
            for k in (
                "hidden_size",
                "intermediate_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "rms_norm_eps",
                "vocab_size",
                "hidden_act",
            )
        },
    }
    folder = work / "specforge"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "draft.json").write_text(json.dumps(draft))
    online = {
        "model": {
            "target_model_path": str(reference_model_dir()), "draft_model_config": str(folder / "draft.json"),
            "vocab_mapping_path": str(mapping), "load_target_embedding": False, "torch_dtype": "float32",
        },
        "data": {"prompts_path": data, "max_length": max_length},
        "deployment": {"mode": "disaggregated", "disaggregated": {
            "control_dir": str(folder / "control"), "backend": "mooncake",
            "server_urls": ["http://127.0.0.1:30000"],  # checked for presence only; nothing connects
            "mooncake_metadata_server": "http://127.0.0.1:8080/metadata",
            "mooncake_master_server_addr": "127.0.0.1:50051",
        }},
        "output_dir": str(folder / "out"),
    }  # fmt: skip
    config = folder / "online.yaml"
    config.write_text(yaml.safe_dump(online, sort_keys=False))
    return config


def specforge_plan(python: Path, config: Path, *, with_mapping: bool) -> dict[str, Any]:
    done = subprocess.run(
        [str(python.parent / "specforge"), "train", "-c", str(config), "--plan"],
        capture_output=True,
        text=True,
    )
    last = (done.stderr.strip().splitlines() or [""])[-1]
    ok = done.returncode == 0 if with_mapping else "require model.vocab_mapping_path" in last
    return {"exit": done.returncode, "as_expected": ok, "message": "" if done.returncode == 0 else last}


# --- speculators ---------------------------------------------------------------------------------------


def prove_speculators(
    python: Path, work: Path, exports: Mapping[str, Any], expect: Mapping[str, Path], args: argparse.Namespace
) -> dict[str, Any]:
    from eagle3_raw.resources import reference_model_dir

    log(
        "speculators 0.9.0: prepare-data from the folder, its cut, the published set; train's vocabulary code"
    )
    model, longest = str(reference_model_dir()), exports["speculators"].longest_row
    out = work / "speculators"
    data = exports["speculators"].output_dir / "data"
    runs = {
        "full": (str(data), longest, expect["full"], True),
        "its_own_cut": (str(data), args.max_length, expect["cut"], False),
        "our_cut": (
            str(exports["speculators_cut"].output_dir / "data"),
            args.max_length,
            expect["cut"],
            False,
        ),
        "no_token_freq": (str(data), longest, expect["full"], None),
    }
    outputs = {}
    for name, (source, length, want, freq) in runs.items():
        prepare_data(python, model, source, out / name, length, token_freq=bool(freq))
        if freq is not None:
            outputs[name] = {"dir": str(out / name), "expect": str(want)}
    with published_demo(work, args.size) as (env, repo, files):
        prepare_data(python, model, f"hf:{repo}:demo:train", out / "hub", longest, token_freq=True, env=env)
    outputs["published_hf"] = {"dir": str(out / "hub"), "expect": str(expect["full"])}
    checked = run_check(
        python,
        "speculators_check.py",
        work / "speculators.json",
        {
            "model": model,
            "vocab_size": 6144,
            "size": args.size,
            "outputs": outputs,
            "export": str(exports["speculators"].output_dir),
            "no_freq_output": str(out / "no_token_freq"),
        },
    )
    names = ["token_freq.pt", f"vocab_mapping-{args.size}.pt", f"d2t-{args.size}.npy", f"t2d-{args.size}.npy"]
    local = {name: (exports["jsonl"].output_dir / name).read_bytes() for name in names}
    checked["pushed_vocab_files_equal_the_export"] = local == {
        name: files.get(f"recipes/demo/vocab/{name}") for name in names
    }
    return checked


def prepare_data(
    python: Path,
    model: str,
    data: str,
    output: Path,
    seq_length: int,
    *,
    token_freq: bool,
    env: Mapping[str, str] | None = None,
) -> None:
    command = [
        str(python.parent / "speculators"),
        "prepare-data",
        "--model",
        model,
        "--data",
        data,
        "--output",
        str(output),
        "--seq-length",
        str(seq_length),
        "--num-preprocessing-workers",
        "1",
    ]
    if token_freq:
        command.append("--no-skip-token-freq")
    shutil.rmtree(output, ignore_errors=True)  # train's vocabulary code caches d2t/t2d into it
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")


@contextlib.contextmanager
def published_demo(work: Path, size: int) -> Iterator[tuple[dict[str, str], str, dict[str, bytes]]]:
    """The demo set pushed to the test Hub server; yields a client environment, the repo, its files."""
    from eagle3_raw import hub
    from tests.support.hub_server import HubServer

    with HubServer() as server:
        with server.pointed_at(work / "hub-home"):
            hub.push(
                "demo",
                "alice/demo",
                tag="v1",
                overrides={"export.draft_vocab_sizes": [size]},
                token=server.tokens.write,
                cache_dir=work / "cache",
                run_options=run_options(work),
            )
        env = server.client_env(work / "client-home", base=os.environ)
        env["HF_TOKEN"] = server.tokens.write
        yield env, "alice/demo", server.files("alice/demo", "v1")


# --- running a check in a trainer's environment -------------------------------------------------------


def run_check(python: Path, script: str, config_path: Path, config: Mapping[str, Any]) -> dict[str, Any]:
    config_path.write_text(json.dumps(config))
    done = subprocess.run(
        [str(python), str(CHECKS / script), str(config_path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{script} failed in {python.parent.parent}:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def failed(results: Mapping[str, Any], path: str = "") -> Any:
    """Every check that did not hold: ``identical``/``as_expected``/``equal...``/... that is false."""
    for key, value in results.items():
        where = f"{path}.{key}" if path else key
        if isinstance(value, Mapping):
            yield from failed(value, where)
        elif value is False:
            yield where


def render(results: Mapping[str, Any], failures: list[str]) -> str:
    lines = [
        "",
        "summary (full results in summary.json)",
        json.dumps(
            {k: results[k] for k in ("set", "specforge", "speculators", "modelopt", "seconds")}, indent=1
        ),
    ]
    lines.append("FAILED: " + ", ".join(failures) if failures else "every check passed")
    return "\n".join(lines)


def log(message: str) -> None:
    print(f"[prove_trainers] {message}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
