"""vLLM as the run's :class:`~eagle3_raw.serving.Engine`: :mod:`eagle3_raw.vllm.client`'s routes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from eagle3_raw.serving import AssistantTurn, Generation, ServerIdentity, TurnToSplit
from eagle3_raw.transport import health
from eagle3_raw.vllm import client

if TYPE_CHECKING:
    from aiohttp import ClientSession


class VLLMEngine:
    """vLLM's token-exact routes (``/v1/completions`` with id prompts, ``/tokenize``, derender)."""

    reasoning_field = "reasoning"
    name = "vllm"

    async def server_identity(self, session: ClientSession, url: str, timeout: float) -> ServerIdentity:
        return await client.server_identity(session, url, timeout)

    async def health(self, session: ClientSession, url: str, timeout: float) -> bool:
        return await health(session, url, timeout)

    async def tokenize(self, session: ClientSession, url: str, text: str, timeout: float) -> list[int]:
        return await client.tokenize(session, url, text, timeout)

    async def tokenize_chat(
        self, session: ClientSession, url: str, body: Mapping[str, Any], timeout: float
    ) -> list[int]:
        return await client.tokenize_chat(session, url, body, timeout)

    async def generate(
        self, session: ClientSession, url: str, *, rid: str, input_ids: Sequence[int],
        sampling_params: Mapping[str, Any], vocab_size: int, timeout: float,
        eos_ids: frozenset[int] = frozenset(),
    ) -> Generation:  # fmt: skip
        return await client.generate(
            session, url, rid=rid, input_ids=input_ids, sampling_params=sampling_params,
            vocab_size=vocab_size, timeout=timeout, eos_ids=eos_ids,
        )  # fmt: skip

    async def abort(self, session: ClientSession, url: str, rid: str, timeout: float = 2.0) -> None:
        await client.abort(session, url, rid, timeout)

    async def split_turn(
        self, session: ClientSession, url: str, turn: TurnToSplit, parsers: Mapping[str, str | None],
        timeout: float,
    ) -> AssistantTurn:  # fmt: skip
        """The server's own parsers split the turn (derender): ``parsers`` name them for the set's
        record, but vLLM parses with those it was started with."""
        return await client.split_turn(session, url, turn, timeout)


VLLM = VLLMEngine()
