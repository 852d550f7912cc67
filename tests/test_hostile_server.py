"""Servers that attack the client (issue 13, findings 7-9, and what must keep holding).

Each hostile server is a real HTTP server on 127.0.0.1: small aiohttp apps for one answer, or a
:class:`~tests.support.hostile.HostileServer` in front of a reference server that tampers with some
answers. Memory ceilings are measured with ``tracemalloc`` (every Python allocation, aiohttp's
buffers included) around the one request.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from eagle3_raw import limits
from eagle3_raw.builder import build
from eagle3_raw.errors import InvalidResponse, RequestTimeout, ServerBusy, ServerUnreachable
from eagle3_raw.journal import Journal
from eagle3_raw.run.build import MAX_DEFAULT_IN_FLIGHT, _default_in_flight
from eagle3_raw.sglang import client as sglang
from tests.helpers import generations, reference_server, rid_row_id, write_prompts, write_recipe
from tests.support.hostile import Forward, HostileServer, json_body
from tests.support.pace import scaled

PROMPT = [1, 2, 3, 4]
VOCAB = 100
MB = 1 << 20

Reply = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _ok(output_ids: list[Any], **meta: Any) -> dict[str, Any]:
    info = {
        "id": "r", "finish_reason": {"type": "stop", "matched": output_ids[-1] if output_ids else 7},
        "prompt_tokens": len(PROMPT), "completion_tokens": len(output_ids), "cached_tokens": 0,
        "weight_version": "default", "e2e_latency": 0.1, **meta,
    }  # fmt: skip
    return {"text": "", "output_ids": output_ids, "meta_info": info}


@pytest.fixture()
async def serve() -> AsyncIterator[Callable[..., Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(reply: Reply, path: str = "/generate", method: str = "POST") -> str:
        app = web.Application()
        app.router.add_route(method, path, reply)
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.2)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def _generate(url: str, timeout: float = 10.0, max_new_tokens: int = 8) -> sglang.Generation:
    async with sglang.new_session(connect_timeout=2, api_key="k") as session:
        return await sglang.generate(
            session, url, rid="r", input_ids=PROMPT, sampling_params={"max_new_tokens": max_new_tokens},
            vocab_size=VOCAB, timeout=timeout,
        )  # fmt: skip


def _json(body: Any, status: int = 200) -> Reply:
    async def reply(request: web.Request) -> web.StreamResponse:
        await request.read()
        if isinstance(body, bytes):
            return web.Response(body=body, status=status, content_type="application/json")
        return json_body(body, status)

    return reply


async def _peak_while(coroutine: Awaitable[Any]) -> tuple[BaseException | None, int]:
    """Run ``coroutine``; the exception it raised (if any) and the peak traced memory meanwhile."""
    tracemalloc.start()
    try:
        await coroutine
        error: BaseException | None = None
    except Exception as exc:  # the caller asserts which
        error = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return error, peak


# --- bounded bodies (finding 7) -----------------------------------------------------------------


def _endless(announce: int | None, status: int = 200) -> Reply:
    """An answer that never ends: the same 1 MiB chunk until the client goes away (announced or
    chunked; the chunk is one object, so the server side holds little)."""

    async def reply(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(status=status, headers={"Content-Type": "application/json"})
        if announce is not None:
            response.content_length = announce
        await response.prepare(request)
        chunk = b'{"output_ids": [' + b"1," * (MB // 2)
        try:
            while True:
                await response.write(chunk)
        except (ConnectionError, RuntimeError):
            pass
        return response

    return reply


@pytest.mark.parametrize("announce", [None, 900 * MB], ids=["chunked", "announced-900MB"])
async def test_a_body_past_its_cap_is_refused_and_memory_stays_small(
    serve: Any, announce: int | None
) -> None:
    cap = limits.response_cap(8, len(PROMPT))
    url = await serve(_endless(announce))
    error, peak = await _peak_while(_generate(url))
    assert isinstance(error, InvalidResponse), error  # retried, then recorded as failed: never a row
    assert f"than the {cap:,} bytes a reply to this request can need" in str(error)
    assert peak < 3 * cap + 4 * MB, f"peak {peak / MB:.1f} MB for a cap of {cap / MB:.1f} MB"


def test_the_cap_follows_max_new_tokens_and_the_prompt_up_to_an_absolute_one() -> None:
    assert limits.response_cap(8, 4) < limits.response_cap(2048, 4) < limits.response_cap(2048, 100_000)
    assert limits.response_cap(2048, 1000) < 2 * MB  # what a usual request may take
    assert limits.response_cap(1 << 24, 1 << 20) == limits.RESPONSE_BYTES


async def test_an_endless_error_body_is_read_only_to_its_start(serve: Any) -> None:
    url = await serve(_endless(None, status=500))
    error, peak = await _peak_while(_generate(url))
    assert isinstance(error, ServerBusy) and "HTTP 500" in str(error)
    assert len(str(error)) < 1000  # the message is cut too
    assert peak < 8 * MB


async def test_a_drip_feeding_server_is_cut_off_by_the_request_timeout(serve: Any) -> None:
    """Keeps holding: the timeout covers the whole answer, not the time between two bytes."""

    async def drip(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for _ in range(1000):
            await response.write(b" ")
            await asyncio.sleep(0.05)
        return response

    url = await serve(drip)
    started = asyncio.get_running_loop().time()
    with pytest.raises(RequestTimeout, match=r"within 0\.5 s"):
        await _generate(url, timeout=0.5)
    assert asyncio.get_running_loop().time() - started < 3


# --- redirects (finding 9) ----------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_of_generate_is_never_followed(serve: Any, status: int) -> None:
    with HostileServer() as elsewhere:

        async def redirect(request: web.Request) -> web.StreamResponse:
            await request.read()
            return web.Response(status=status, headers={"Location": f"{elsewhere.url}/generate"})

        url = await serve(redirect)
        with pytest.raises(sglang.Redirected, match=rf"HTTP {status} from .*redirects to {elsewhere.url}"):
            await _generate(url)
    assert elsewhere.requests == []  # nothing, and so no Authorization either, went to the other origin


async def test_a_redirect_of_a_side_endpoint_is_never_followed(serve: Any) -> None:
    with HostileServer() as elsewhere:

        async def redirect(request: web.Request) -> web.StreamResponse:
            return web.Response(status=302, headers={"Location": f"{elsewhere.url}/model_info"})

        url = await serve(redirect, "/model_info", "GET")
        async with sglang.new_session(connect_timeout=2, api_key="k") as session:
            with pytest.raises(sglang.Redirected, match="does not follow redirects"):
                await sglang.server_identity(session, url, 2)
    assert elsewhere.requests == []


# --- every journaled field checked (findings 8, 9) -------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_ok([5, 7], prompt_tokens="4"), "meta_info prompt_tokens is '4'"),
        (_ok([5, 7], prompt_tokens=None), "meta_info has no prompt_tokens"),  # issue 22, finding 8
        (_ok([7], completion_tokens=True), "meta_info completion_tokens is True"),
        (_ok([5, 7], cached_tokens=-1), "meta_info cached_tokens is -1"),
        (_ok([5, 7], cached_tokens=2**31), "meta_info cached_tokens is 2147483648"),
        (_ok([5, 7], cached_tokens=[1]), r"meta_info cached_tokens is \[1\]"),
        (_ok([5, 7], e2e_latency="fast"), "meta_info e2e_latency is 'fast'"),
        (_ok([5, 7], e2e_latency=-1.0), "meta_info e2e_latency is -1.0"),
        (_ok([5, 7], weight_version="v" * 300), "meta_info weight_version is 'vvv"),
        (_ok([5, 7], weight_version={"v": 1}), "meta_info weight_version is {'v': 1}"),
        (_ok([5, 7], finish_reason={"type": "stop", "matched": {"id": 7}}), "finish_reason.matched"),
        (_ok([5, 7], finish_reason={"type": "length", "length": "8"}), "finish_reason.length"),
        (_ok([5, 7], finish_reason="stop"), "unexpected finish_reason 'stop'"),
        (_ok(list(range(10)) * 10_000 + [7]), "100,001 output ids for max_new_tokens=8"),
        (_ok([5, 7, 9], finish_reason={"type": "stop", "matched": 7}), "stopped on token id 7 but the last"),
        (_ok([], finish_reason={"type": "stop", "matched": 7}), "last output id is none"),
        (_ok([5, True, 7]), "a boolean among the output ids"),
        (_ok([5, False, 7]), "a boolean among the output ids"),
        (_ok([5, "7", 7]), "not an int64"),
        (_ok([5, [7], 7]), "not an int64"),
        (orjson.dumps(_ok([5, 0, 7])).replace(b"[5,0,7]", b"[5,1180591620717411303424,7]"), "not an int64"),
    ],
)
async def test_a_field_of_the_wrong_type_or_count_is_a_bad_response(
    serve: Any, body: Any, message: str
) -> None:
    with pytest.raises(InvalidResponse, match=message):
        await _generate(await serve(_json(body)))


async def test_an_early_stop_id_is_refused_unless_ignore_eos_was_sent(serve: Any) -> None:
    """Issue 21 finding 3: a stop id (the one the server reports, the model's EOS, a stop_token_ids
    one) before the last position is a bad answer; with ignore_eos every id may repeat."""
    url = await serve(_json(_ok([5, 7, 6, 9, 7])))  # stopped on 7, which came at position 1 already
    with pytest.raises(InvalidResponse, match="stop token id 7 at output position 1 of 5"):
        await _generate(url)
    async with sglang.new_session(connect_timeout=2, api_key=None) as session:

        async def ask(url: str, **sampling: Any) -> sglang.Generation:
            return await sglang.generate(
                session, url, rid="r", input_ids=PROMPT, sampling_params={"max_new_tokens": 8, **sampling},
                vocab_size=VOCAB, timeout=10, eos_ids=frozenset({9}),
            )  # fmt: skip

        assert (await ask(url, ignore_eos=True)).output_ids == [5, 7, 6, 9, 7]
        length = await serve(_json(_ok([5, 9, 6], finish_reason={"type": "length", "length": 3})))
        with pytest.raises(InvalidResponse, match="stop token id 9 at output position 1"):
            await ask(length)  # the model's EOS (from its tokenizer), whatever the finish
        stopped = await serve(_json(_ok([5, 4, 6], finish_reason={"type": "length", "length": 3})))
        with pytest.raises(InvalidResponse, match="stop token id 4 at output position 1"):
            await ask(stopped, stop_token_ids=[4])
        assert (await ask(stopped)).output_ids == [5, 4, 6]


async def test_a_stop_on_a_string_or_the_last_id_is_accepted(serve: Any) -> None:
    for finish in ({"type": "stop", "matched": "</s>"}, {"type": "stop", "matched": [3, 7]},
                   {"type": "length", "length": 8}, {"type": "stop", "matched": None}):  # fmt: skip
        generation = await _generate(await serve(_json(_ok([5, 6, 7], finish_reason=finish))))
        assert generation.output_ids == [5, 6, 7]


def _tamper(rows: set[str], change: Callable[[dict[str, Any]], None]) -> Callable[..., Awaitable[Any]]:
    """A /generate handler: the reference server's answer, changed by ``change`` for ``rows``."""

    async def handler(request: web.Request, forward: Forward) -> web.StreamResponse:
        status, body = await forward()
        rid = orjson.loads(await request.read())["rid"]
        answer = orjson.loads(body)
        if status == 200 and rid_row_id(rid).split(":")[0] in rows:
            change(answer)
        return json_body(answer, status)

    return handler


@pytest.mark.slow
def test_bad_server_data_is_never_journaled_and_the_set_still_builds(tmp_path: Path) -> None:
    """Finding 8: a wrong meta_info type used to be journaled, then crash the Arrow conversion of
    every rerun and merge. Now it is a bad response: retried, recorded as failed, never a row."""
    write_prompts(tmp_path, 6)

    def poison(answer: dict[str, Any]) -> None:
        answer["meta_info"]["cached_tokens"] = "lots"

    routes = {"/generate": _tamper({"p001", "p004"}, poison)}
    options = {"journal_dir": tmp_path / "journals", "progress": "none"}
    with reference_server(tmp_path) as (server, _), HostileServer(routes, worker=server.url) as hostile:
        recipe = write_recipe(tmp_path, endpoints=[hostile.url], server={"max_retries": 1})
        built = build(str(recipe), cache_dir=tmp_path / "cache", run_options=options)
    ids = sorted(built.dataset["source_id"])
    assert ids == ["p000", "p002", "p003", "p005"]
    with Journal.read_dir(built.journal_dir) as journal:
        failures = {f["id"].split(":")[0]: f["reason"] for f in journal.failures()}
    assert set(failures) == {"p001", "p004"}
    assert all("meta_info cached_tokens is 'lots'" in reason for reason in failures.values())
    again = build(str(recipe), cache_dir=tmp_path / "cache2", run_options={**options, "generate": False})
    assert sorted(again.dataset["source_id"]) == ids  # merge reads the journal without a crash


@pytest.mark.slow
def test_a_404_on_generate_from_a_server_that_answered_is_not_called_unreachable(tmp_path: Path) -> None:
    write_prompts(tmp_path, 2)

    async def missing(request: web.Request, forward: Forward) -> web.StreamResponse:
        return json_body({"detail": "Not Found"}, 404)

    routes = {"/generate": missing}
    with reference_server(tmp_path) as (server, _), HostileServer(routes, worker=server.url) as h:
        recipe = write_recipe(tmp_path, endpoints=[h.url])
        with pytest.raises(sglang.EndpointNotFound) as raised:
            build(str(recipe), cache_dir=tmp_path / "cache", run_options={"journal_dir": tmp_path / "j"})
    message = str(raised.value)
    assert f"HTTP 404 from {h.url}/generate" in message
    assert "the server answered, but has no such route" in message
    assert "unreachable" not in message and "cannot reach" not in message


@pytest.mark.slow
def test_a_408_is_retried_and_the_rows_come_through(tmp_path: Path) -> None:
    write_prompts(tmp_path, 4)
    refused: set[str] = set()

    async def once(request: web.Request, forward: Forward) -> web.StreamResponse:
        row = rid_row_id(orjson.loads(await request.read())["rid"])
        if row not in refused:
            refused.add(row)
            return web.Response(text="Request Timeout", status=408)
        status, body = await forward()
        return web.Response(body=body, status=status, content_type="application/json")

    routes = {"/generate": once}
    with reference_server(tmp_path) as (server, ledger), HostileServer(routes, worker=server.url) as h:
        recipe = write_recipe(tmp_path, endpoints=[h.url])
        built = build(str(recipe), cache_dir=tmp_path / "cache", run_options={"journal_dir": tmp_path / "j"})
    assert len(built.dataset) == 4 and len(refused) == 4 and len(generations(ledger)) == 4
    assert all(meta["attempts"] == 2 for meta in built.dataset["meta"])


@pytest.mark.slow
def test_url_credentials_never_reach_the_rows_or_the_journal(tmp_path: Path) -> None:
    write_prompts(tmp_path, 3)
    with reference_server(tmp_path) as (server, _):
        url = server.url.replace("http://", "http://alice:pw-e3raw-8c1d@")
        recipe = write_recipe(tmp_path, endpoints=[url])
        built = build(str(recipe), cache_dir=tmp_path / "cache", run_options={"journal_dir": tmp_path / "j"})
    assert {meta["endpoint"] for meta in built.dataset["meta"]} == {"0"}  # its index, not its URL
    for path in [*built.journal_dir.rglob("*"), *(tmp_path / "cache").rglob("*")]:
        if path.is_file():
            assert b"pw-e3raw-8c1d" not in path.read_bytes(), path


async def test_an_absurd_max_running_requests_is_capped() -> None:
    """Keeps holding: the in-flight default a server's report drives has a ceiling."""
    rank = {"effective_max_running_requests_per_dp": 10**9}
    huge = {"max_running_requests": 10**9, "internal_states": [rank]}
    routes = {
        "/model_info": _static({"model_path": "m"}),
        "/server_info": _static(huge),
        "/v1/models": _static({"data": []}),
    }
    with HostileServer(routes) as server:
        async with sglang.new_session(connect_timeout=2, api_key=None) as session:
            identity = await sglang.server_identity(session, server.url, 2)
    assert identity.max_running_requests == 10**9
    assert _default_in_flight([identity]) == MAX_DEFAULT_IN_FLIGHT == 1024


def _static(body: Any) -> Callable[..., Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request, forward: Forward) -> web.StreamResponse:
        return json_body(body)

    return handler


def _set_ids(change: Callable[[list[Any]], list[Any]]) -> Callable[[dict[str, Any]], None]:
    def poison(answer: dict[str, Any]) -> None:
        answer["output_ids"] = change(answer["output_ids"])
        answer["meta_info"]["completion_tokens"] = len(answer["output_ids"])

    return poison


def _past_stop(answer: dict[str, Any]) -> None:
    """A stop on an id that two more ids follow (sglang#31599), within max_new_tokens."""
    ids = answer["output_ids"][:4]
    answer["meta_info"]["finish_reason"] = {"type": "stop", "matched": ids[-1]}
    _set_ids(lambda _: [*ids, 5, 6])(answer)


REFERENCE_EOS = 6139  # <|im_end|>, the reference model's EOS (its tokenizer's and generation_config's)


def _eos_inside(finish: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """``[a, b, c, EOS, a, a, EOS]`` (issue 21 finding 3): an EOS in the middle of an answer
    generated without ignore_eos; a real SGLang stops at the first one."""

    def poison(answer: dict[str, Any]) -> None:
        a, b, c = answer["output_ids"][:3]
        answer["meta_info"]["finish_reason"] = finish
        _set_ids(lambda _: [a, b, c, REFERENCE_EOS, a, a, REFERENCE_EOS])(answer)

    return poison


def _meta(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def poison(answer: dict[str, Any]) -> None:
        answer["meta_info"].update(changes)

    return poison


POISONS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "a float id": (_set_ids(lambda ids: [1.5, *ids[1:]]), "not an int64"),
    "a null id": (_set_ids(lambda ids: [None, *ids[1:]]), "not an int64"),
    "a string id": (_set_ids(lambda ids: ["5", *ids[1:]]), "not an int64"),
    "a boolean id": (_set_ids(lambda ids: [True, *ids[1:]]), "a boolean among the output ids"),
    "a negative id": (_set_ids(lambda ids: [-1, *ids[1:]]), "token id -1 outside the vocabulary"),
    "an id past the vocabulary": (_set_ids(lambda ids: [10**6, *ids[1:]]), "outside the vocabulary"),
    "ids after the stop id": (_past_stop, "ids after the stop token are a bad response"),
    "more ids than max_new_tokens": (_set_ids(lambda ids: ids * 100), "output ids for max_new_tokens=64"),
    "an EOS before the stop on it": (
        _eos_inside({"type": "stop", "matched": REFERENCE_EOS}),
        "stop token id 6139 at output position 3 of 7",
    ),
    "the model's EOS before a length end": (
        _eos_inside({"type": "length", "length": 7}),
        "stop token id 6139 at output position 3",
    ),
    "an abort": (_meta(finish_reason={"type": "abort", "message": "Abort in waiting queue"}), "aborted"),
    "a completion_tokens mismatch": (_meta(completion_tokens=10**4), "completion_tokens=10000 but"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(POISONS))
def test_a_bad_answer_is_retried_then_recorded_as_failed_never_a_row(tmp_path: Path, name: str) -> None:
    """Keeps holding: malformed ids of every kind, aborts, count mismatches."""
    poison, reason = POISONS[name]
    write_prompts(tmp_path, 3)
    routes = {"/generate": _tamper({"p001"}, poison)}
    with reference_server(tmp_path) as (server, _), HostileServer(routes, worker=server.url) as hostile:
        recipe = write_recipe(tmp_path, endpoints=[hostile.url], server={"max_retries": 2})
        built = build(str(recipe), cache_dir=tmp_path / "cache", run_options={"journal_dir": tmp_path / "j"})
    assert sorted(built.dataset["source_id"]) == ["p000", "p002"]
    attempts = [r for r in hostile.requests if r.path == "/generate" and b'"rid":"p001' in r.body]
    assert len(attempts) == 3  # the first try and max_retries more
    with Journal.read_dir(built.journal_dir) as journal:
        (failure,) = journal.failures()
    assert failure["kind"] == "failed" and "3 attempts failed" in failure["reason"]
    assert reason in failure["reason"], failure["reason"]


# --- the render probe ----------------------------------------------------------------------------


def _slow_chat_renders(
    delays: list[float],
) -> Callable[[web.Request, Forward], Awaitable[web.StreamResponse]]:
    """``/tokenize``: each chat request (``messages``) first waits the next of ``delays`` seconds."""

    async def tokenize(request: web.Request, forward: Forward) -> web.StreamResponse:
        if b'"messages"' in await request.read() and delays:
            await asyncio.sleep(delays.pop(0))
        status, body = await forward()
        return web.Response(body=body, status=status, content_type="application/json")

    return tokenize


@pytest.mark.slow
def test_a_slow_first_chat_render_is_waited_for_and_a_silent_one_stops_the_build(tmp_path: Path) -> None:
    """A server whose first chat render takes longer than the timeout still renders the prompts
    (the probe is tried again, never taken for "cannot render"); one that never answers it stops
    the build naming its /tokenize, and nothing is generated."""
    # The probe's limit at the machine's pace: a forwarded render must fit in it under load, and
    # the slow and silent renders are measured in it.
    timeout = round(scaled(1.5), 1)
    write_prompts(tmp_path, 4)
    options = {"journal_dir": tmp_path / "journals", "progress": "none"}
    with reference_server(tmp_path) as (server, ledger):
        slow = HostileServer({"/tokenize": _slow_chat_renders([2 * timeout])}, worker=server.url)
        with slow:
            recipe = write_recipe(tmp_path, endpoints=[slow.url], server={"connect_timeout": timeout})
            built = build(str(recipe), cache_dir=tmp_path / "cache", run_options=options)
        chats = [r for r in slow.requests if r.path == "/tokenize" and b'"messages"' in r.body]
        assert built.run_result is not None and built.run_result.target.render == "server"
        assert len(built.dataset) == 4 and len(chats) >= 2 + 4  # the probe twice, then every prompt
        silent = HostileServer({"/tokenize": _slow_chat_renders([3 * timeout] * 8)}, worker=server.url)
        with silent:
            recipe = write_recipe(
                tmp_path, endpoints=[silent.url], server={"connect_timeout": timeout},
                sampling={"max_new_tokens": 9},
            )  # fmt: skip
            with pytest.raises(
                ServerUnreachable, match=r"/tokenize did not answer a chat request in 4 tries"
            ):
                build(str(recipe), cache_dir=tmp_path / "cache", run_options=options)
        assert len(generations(ledger)) == 4  # the first build's rows only
