"""Fixtures of the reference server's tests: SGLang's contract, launched servers, the checking client."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

from eagle3_raw.launching.reference import ReferenceProcess, launch_reference
from tests.reference.conformance import Conformance
from tests.reference.contract import load_contract


@pytest.fixture(scope="session")
def contract() -> ModuleType:
    """``sglang/api/v1/api_types.py`` of sglang 0.5.23 (downloaded once, then cached)."""
    return load_contract()


@pytest.fixture(scope="session")
def server() -> Iterator[ReferenceProcess]:
    """A reference server with default options, shared by the whole session."""
    with launch_reference() as process:
        yield process


@pytest.fixture(scope="session")
def sglang(server: ReferenceProcess, contract: ModuleType) -> Conformance:
    """The contract-checking client of the shared server."""
    return Conformance(server.url, contract)


@pytest.fixture
def launch() -> Iterator[Callable[..., ReferenceProcess]]:
    """Start servers with extra options (``launch("--slots", "2", ...)``); all stopped afterwards."""
    started: list[ReferenceProcess] = []

    def start(*args: str, **kwargs: Any) -> ReferenceProcess:
        process = launch_reference(args=args, **kwargs)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
        process.log_path.unlink(missing_ok=True)
