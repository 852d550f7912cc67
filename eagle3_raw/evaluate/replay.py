"""Replaying points through one speculating server: its native ``/generate`` with ``input_ids``,
each answer checked as a build checks it (:func:`eagle3_raw.sglang.client.generate`).

Before any point is sent the server must say it speculates (``speculative_algorithm`` in
``/server_info``); the first point then goes alone, and an answer of two tokens or more without
SGLang's ``spec_*`` figures stops the replay there (a server that reports a drafter but measures
nothing would give an empty report). At most ``max_in_flight`` requests are in flight; a request
that fails for a retryable reason (connection, timeout, 5xx, a bad answer) is tried again with
:func:`eagle3_raw.run.retry.retried`; one refused for good, or out of attempts, is a failure of
its point (counted, with its reason), not of the replay. A fatal error (credentials, no such
route) stops it.

An answer's latency is the server's ``e2e_latency`` (SGLang's, from receipt to the last token,
queueing in the server included), else the time the client waited for it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from eagle3_raw.errors import RequestTimeout, RowError, ServerMismatch
from eagle3_raw.evaluate.sets import Point
from eagle3_raw.redact import public_url
from eagle3_raw.run.plan import fit_max_new_tokens
from eagle3_raw.run.retry import retried
from eagle3_raw.sglang import client as sglang
from eagle3_raw.sglang.protocol.outputs import SPEC_KEYS


@dataclass(frozen=True)
class Answer:
    """What the server answered for one point (the ids themselves are not kept)."""

    point: Point
    completion_tokens: int
    finish_reason: str
    spec: Mapping[str, Any]
    """Each of SGLang's ``spec_*`` keys as the server sent it (None when it sent none)."""
    latency: float
    """Seconds: the server's ``e2e_latency``, else the client's wait."""

    @property
    def measured(self) -> bool:
        """Whether the server measured this request (it had a verify step)."""
        return self.spec.get("spec_verify_ct") is not None


@dataclass(frozen=True)
class Failure:
    """A point with no answer: refused for good, or every attempt failed."""

    point: Point
    reason: str


@dataclass(frozen=True)
class Replay:
    """One server's answers to every point, in the points' order."""

    url: str
    """The server's URL without credentials."""
    drafter: Mapping[str, Any]
    """The drafter ``/server_info`` reports (:attr:`~eagle3_raw.sglang.client.ServerIdentity.drafter`)."""
    answers: tuple[Answer, ...]
    failures: tuple[Failure, ...]
    seconds: float
    """Wall time from the first request sent to the last answer."""


@dataclass(frozen=True)
class ReplayOptions:
    """How to talk to a server: the tokenizer's facts an answer is checked against, and limits."""

    vocab_size: int
    eos_ids: frozenset[int] = frozenset()
    api_key: str | None = None
    max_in_flight: int = 16
    request_timeout: float = 600.0
    connect_timeout: float = 10.0
    retries: int = 3


def replay(url: str, points: Sequence[Point], options: ReplayOptions) -> Replay:
    """Replay ``points`` through the server at ``url`` (see the module docstring)."""
    return asyncio.run(replay_async(url, points, options))


async def replay_async(url: str, points: Sequence[Point], options: ReplayOptions) -> Replay:
    """:func:`replay`, in a running event loop."""
    url = url.rstrip("/")
    session = sglang.new_session(connect_timeout=options.connect_timeout, api_key=options.api_key)
    async with session:
        identity = await sglang.server_identity(session, url, options.connect_timeout)
        if not identity.drafter:
            raise ServerMismatch(not_speculating(url))
        sender = _Sender(session, url, identity, options)
        started = time.monotonic()
        first = [await sender.send(points[0])] if points else []
        outcomes = first + await _all(sender, points[1:])
        seconds = time.monotonic() - started
    answers = tuple(o for o in outcomes if isinstance(o, Answer))
    failures = tuple(o for o in outcomes if isinstance(o, Failure))
    return Replay(public_url(url), dict(identity.drafter), answers, failures, seconds)


async def _all(sender: _Sender, points: Sequence[Point]) -> list[Answer | Failure]:
    """Every point's outcome, in order; the first error raised stops the others and is raised
    as itself (not in an ExceptionGroup: the command line reports one error)."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(sender.send(point)) for point in points]
    except ExceptionGroup as raised:
        raise raised.exceptions[0] from None
    return [task.result() for task in tasks]


class _Sender:
    """Sends points to one server, at most ``max_in_flight`` at a time."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        identity: sglang.ServerIdentity,
        options: ReplayOptions,
    ) -> None:
        self.session = session
        self.url = url
        self.identity = identity
        self.options = options
        self.slots = asyncio.Semaphore(max(1, options.max_in_flight))
        self.stop = threading.Event()  # never set: Ctrl-C cancels the replay's tasks instead
        self.run = uuid.uuid4().hex[:8]

    async def send(self, point: Point) -> Answer | Failure:
        limit = self.identity.input_limit
        if limit is not None and len(point.prompt_ids) > limit:
            reason = (
                f"prompt of {len(point.prompt_ids):,} tokens; {public_url(self.url)} takes at most {limit:,}"
            )
            return Failure(point, reason)
        params = fit_max_new_tokens(
            dict(point.sampling_params), len(point.prompt_ids), self.identity.token_budget
        )

        async def attempt(number: int) -> tuple[sglang.Generation, float]:
            rid = f"eval:{point.row_id}:{point.turn}#{number}-{self.run}{uuid.uuid4().hex[:8]}"
            async with self.slots:
                sent = time.monotonic()
                try:
                    generation = await sglang.generate(
                        self.session, self.url, rid=rid, input_ids=point.prompt_ids, sampling_params=params,
                        vocab_size=self.options.vocab_size, timeout=self.options.request_timeout,
                        eos_ids=self.options.eos_ids,
                    )  # fmt: skip
                except RequestTimeout:
                    await sglang.abort(self.session, self.url, rid)  # the server would go on generating
                    raise
                return generation, time.monotonic() - sent

        try:
            generation, waited = await retried(attempt, retries=self.options.retries, stop=self.stop)
        except RowError as exc:
            return Failure(point, str(exc))
        return self._answer(point, generation, waited)

    def _answer(self, point: Point, generation: sglang.Generation, waited: float) -> Answer:
        meta = generation.meta
        spec = {key: meta.get(key) for key in SPEC_KEYS}
        tokens = len(generation.output_ids)
        if tokens >= 2 and spec["spec_verify_ct"] is None:
            raise ServerMismatch(
                f"{public_url(self.url)} reports a drafter "
                f"({self.identity.drafter.get('speculative_algorithm')}) but its answer of {tokens} tokens "
                f"to row {point.row_id} carries none of SGLang's spec_* figures (meta_info spec_verify_ct, "
                "spec_accept_length, ...): nothing to measure"
            )
        latency = meta.get("e2e_latency")
        seconds = float(latency) if isinstance(latency, int | float) and latency > 0 else waited
        return Answer(point, tokens, generation.finish_reason, spec, seconds)


def not_speculating(url: str) -> str:
    """The message for a server that runs no drafter."""
    return (
        f"{public_url(url.rstrip('/'))} does not speculate: its /server_info reports no "
        "speculative_algorithm, so there is no drafter to measure (start it with one: SGLang's "
        "--speculative-algorithm EAGLE3 --speculative-draft-model-path ...)"
    )
