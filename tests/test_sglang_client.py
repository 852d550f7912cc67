"""The /generate client against a server that misbehaves on purpose (real HTTP on 127.0.0.1).

The reference server answers correctly; these are the answers a broken or misconfigured SGLang
deployment could give, and what the client must make of each: retry, record the row, or stop.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web

from eagle3_raw.errors import (
    ConnectError,
    GenerationAborted,
    InvalidResponse,
    RequestRejected,
    RequestTimeout,
    ServerBusy,
    ServerUnreachable,
)
from eagle3_raw.sglang import client as sglang

PROMPT = [1, 2, 3, 4]
VOCAB = 100


def _ok(output_ids: list[Any], **meta: Any) -> dict[str, Any]:
    info = {
        "id": "r", "finish_reason": {"type": "stop", "matched": 7}, "prompt_tokens": len(PROMPT),
        "completion_tokens": len(output_ids), "cached_tokens": 0, "weight_version": "default", **meta,
    }  # fmt: skip
    return {"text": "", "output_ids": output_ids, "meta_info": info}


Reply = Callable[[], Awaitable[web.StreamResponse]]


@pytest.fixture()
async def serve() -> AsyncIterator[Callable[[Reply], Any]]:
    runners: list[web.AppRunner] = []

    async def start(reply: Reply) -> str:
        async def generate(request: web.Request) -> web.StreamResponse:
            await request.read()
            return await reply()

        app = web.Application()
        app.router.add_post("/generate", generate)
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.2)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def _generate(url: str, timeout: float = 5.0) -> sglang.Generation:
    async with sglang.new_session(connect_timeout=2, api_key=None) as session:
        return await sglang.generate(
            session, url, rid="r", input_ids=PROMPT, sampling_params={"max_new_tokens": 8},
            vocab_size=VOCAB, timeout=timeout,
        )  # fmt: skip


def _json(body: Any, status: int = 200) -> Reply:
    async def reply() -> web.StreamResponse:
        return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")

    return reply


async def test_a_good_response_is_returned_as_sent(serve: Any) -> None:
    generation = await _generate(await serve(_json(_ok([5, 6, 7]))))
    assert generation.output_ids == [5, 6, 7] and generation.finish_reason == "stop"
    assert generation.meta["prompt_tokens"] == 4 and generation.meta["endpoint"].startswith(
        "http://127.0.0.1:"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_ok([5, 6, 7], completion_tokens=2), "completion_tokens=2 but 3 output_ids"),
        (_ok([5, 600]), "token id 600 outside the vocabulary"),
        (_ok([5, -1]), "token id -1 outside the vocabulary"),
        (_ok([5, 6.5]), "not an int64"),
        (_ok([5, None]), "not an int64"),
        (_ok([*PROMPT, 9]), "echoes the prompt"),
        (_ok([5], finish_reason={"type": "weird"}), "unexpected finish_reason"),
        ({"output_ids": [5]}, "lacks output_ids or meta_info"),
        ([_ok([5])], "not one JSON object"),
    ],
)
async def test_a_response_that_fails_a_check_is_retryable(serve: Any, body: Any, message: str) -> None:
    with pytest.raises(InvalidResponse, match=message):
        await _generate(await serve(_json(body)))


async def test_an_abort_with_http_200_is_a_failure_never_a_row(serve: Any) -> None:
    aborted = _ok([5, 6], finish_reason={"type": "abort", "message": "Abort in waiting queue"})
    with pytest.raises(GenerationAborted, match="Abort in waiting queue"):
        await _generate(await serve(_json(aborted)))


async def test_a_server_that_truncated_the_prompt_is_refused_for_the_row(serve: Any) -> None:
    with pytest.raises(RequestRejected, match="allow-auto-truncate"):
        await _generate(await serve(_json(_ok([5], prompt_tokens=3))))


@pytest.mark.parametrize(
    ("body", "status", "kind", "message"),
    [
        ({"error": "unknown field `seed`"}, 400, RequestRejected, "unknown field `seed`"),
        ({"error": {"message": "The input (5000 tokens) is longer"}}, 400, RequestRejected, "is longer"),
        (
            {"object": "error", "message": "queue full", "type": "503", "code": 503},
            503,
            ServerBusy,
            "queue full",
        ),
        ({"error": {"message": "Duplicate request ID detected"}}, 400, ServerBusy, "Duplicate request ID"),
        ("Internal Server Error", 500, ServerBusy, "Internal Server Error"),
        ({"error": "slow down"}, 429, ServerBusy, "slow down"),
        ({"detail": "Not Found"}, 404, sglang.EndpointNotFound, r"answered, but has no such route"),
        ({"detail": "Method Not Allowed"}, 405, sglang.EndpointNotFound, "does not take this method"),
        ({"error": "Unauthorized"}, 401, sglang.AuthError, "api_key_env"),
        ({"error": "admin only"}, 403, sglang.AuthError, "admin only"),
        ("Request Timeout", 408, ServerBusy, "HTTP 408"),  # a proxy's: the same request may pass later
        ("Bad Gateway", 502, ServerBusy, "HTTP 502"),
        ("Gateway Timeout", 504, ServerBusy, "HTTP 504"),
        ("Payload Too Large", 413, RequestRejected, "HTTP 413"),  # this row's request, for good
        ({"error": "weird"}, 299, InvalidResponse, "not a status an SGLang server answers"),
    ],
)
async def test_error_bodies_map_to_what_the_run_does(
    serve: Any, body: Any, status: int, kind: type[Exception], message: str
) -> None:
    with pytest.raises(kind, match=message) as raised:
        await _generate(await serve(_json(body, status)))
    assert "127.0.0.1" in str(raised.value)  # names the URL


async def test_a_reply_that_never_comes_times_out(serve: Any) -> None:
    async def hang() -> web.StreamResponse:
        await asyncio.sleep(30)
        return web.Response()

    with pytest.raises(RequestTimeout, match=r"within 0\.3 s"):
        await _generate(await serve(hang), timeout=0.3)


async def test_a_refused_connection_is_retryable_and_names_the_url() -> None:
    with pytest.raises(ConnectError, match=r"127\.0\.0\.1:9"):
        await _generate("http://127.0.0.1:9")


def test_error_message_reads_all_three_sglang_shapes() -> None:
    assert sglang.error_message(b'{"error": "a"}') == "a"
    assert sglang.error_message(b'{"error": {"message": "b"}}') == "b"
    assert sglang.error_message(b'{"object": "error", "message": "c", "code": 503}') == "c"
    assert sglang.error_message(b"plain text") == "plain text"


async def test_a_web_page_instead_of_sglang_is_named_clearly() -> None:
    app = web.Application()
    for path in ("/model_info", "/server_info", "/v1/models"):
        app.router.add_get(path, _page)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with sglang.new_session(connect_timeout=2, api_key=None) as session:
            with pytest.raises(ServerUnreachable, match=r"did not answer JSON: is it an SGLang server"):
                await sglang.server_identity(session, url, 2)
    finally:
        await runner.cleanup()


async def _page(request: web.Request) -> web.Response:
    return web.Response(text="<html>dashboard</html>", content_type="text/html")


async def test_a_server_that_accepts_but_never_answers_is_named_with_the_timeout() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # the kernel completes the handshakes; nothing ever reads or replies
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        async with sglang.new_session(connect_timeout=2, api_key=None) as session:
            with pytest.raises(ServerUnreachable) as raised:
                await sglang.server_identity(session, url, 0.3)
    assert str(raised.value) == f"cannot reach {url}/model_info: no answer within 0.3 s"


_RANK = {"effective_max_running_requests_per_dp": 48}


@pytest.mark.parametrize(
    ("server_info", "expected"),
    [
        ({"max_running_requests": None, "dp_size": 2, "internal_states": [_RANK, _RANK]}, 96),
        ({"max_running_requests": 64, "internal_states": [{}]}, 64),  # an older server: the flag
        ({"max_running_requests": None, "internal_states": []}, None),
    ],
)  # fmt: skip
async def test_the_batch_size_is_what_the_schedulers_really_run(
    server_info: dict[str, Any], expected: int | None
) -> None:
    """SGLang's ``/server_info`` has null for ``--max-running-requests`` unless it was passed; the
    scheduler's effective value per DP rank is in ``internal_states``."""
    app = web.Application()
    answers = {"/model_info": {"model_path": "m"}, "/server_info": server_info, "/v1/models": {"data": []}}
    for path, body in answers.items():
        app.router.add_get(path, lambda _, body=body: web.json_response(body))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        async with sglang.new_session(connect_timeout=2, api_key=None) as session:
            identity = await sglang.server_identity(session, f"http://127.0.0.1:{runner.addresses[0][1]}", 2)
    finally:
        await runner.cleanup()
    assert identity.max_running_requests == expected
