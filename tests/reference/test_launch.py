"""``launch_reference``: a server on a free loopback port, restarts on the same port, clear failures."""

from __future__ import annotations

import pytest

from eagle3_raw.errors import ServerUnreachable
from eagle3_raw.reference.launch import free_port, launch_reference
from tests.reference.wire import get, request


def test_a_launched_server_answers_and_stops() -> None:
    with launch_reference() as server:
        assert server.url == f"http://127.0.0.1:{server.port}"
        assert get(server.url, "/health").status == 200
    assert server.process.poll() is not None
    assert not server.log_path.exists()


def test_restart_keeps_the_port_and_the_options() -> None:
    with launch_reference(args=["--context-length", "512"]) as server:
        port, first = server.port, server.process.pid
        server.restart()
        assert server.port == port and server.process.pid != first
        assert get(server.url, "/v1/models").json()["data"][0]["max_model_len"] == 512


def test_kill_stops_the_server_at_once_and_restart_brings_it_back() -> None:
    with launch_reference() as server:
        server.kill()
        with pytest.raises(OSError):
            get(server.url, "/health", timeout=1)
        server.restart()
        assert (
            request(
                server.url, "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}
            ).status
            == 200
        )


def test_a_given_port_is_used() -> None:
    port = free_port()
    with launch_reference(port=port) as server:
        assert server.port == port and get(f"http://127.0.0.1:{port}", "/health").status == 200


def test_a_server_that_cannot_start_is_reported_with_its_log() -> None:
    with pytest.raises(
        ServerUnreachable, match=r"(?s)exited with code 2.*--slots and --ms-per-token go together"
    ):
        launch_reference(args=["--slots", "2"])


def test_environment_additions_reach_the_server() -> None:
    with launch_reference(env={"EAGLE3_RAW_UNUSED": "1"}) as server:
        assert get(server.url, "/health").status == 200
