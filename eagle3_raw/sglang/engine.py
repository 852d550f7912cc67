"""SGLang as the run's :class:`~eagle3_raw.serving.Engine`: the native API of
:mod:`eagle3_raw.sglang.client`, and its chat API's output parsers for a rollout's turns."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from eagle3_raw.serving import AssistantTurn, Generation, ServerIdentity, ToolCall, TurnToSplit
from eagle3_raw.sglang import client

if TYPE_CHECKING:
    from aiohttp import ClientSession


class SGLangEngine:
    """SGLang 0.5.23's native API (``/generate``, ``/tokenize``, ``/model_info``, ``/server_info``)."""

    reasoning_field = "reasoning_content"
    name = "sglang"

    async def server_identity(self, session: ClientSession, url: str, timeout: float) -> ServerIdentity:
        return await client.server_identity(session, url, timeout)

    async def health(self, session: ClientSession, url: str, timeout: float) -> bool:
        return await client.health(session, url, timeout)

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
        """The turn's text (the server's decode, ``/detokenize`` for one journaled without it) through
        ``/separate_reasoning``, then ``/parse_function_call`` against the request's tools, as its
        chat API does (``sglang-protocol.md`` §14.2); no parser: all of it is content."""
        text = turn.text
        if text is None:
            text = await client.detokenize(session, url, turn.output_ids, turn.skip_special_tokens, timeout)
        reasoning, tools = "", turn.chat_request.get("tools")
        if parser := parsers.get("reasoning_parser"):
            reasoning, text = await client.separate_reasoning(session, url, text, parser, timeout)
        calls: list[ToolCall] = []
        if (parser := parsers.get("tool_call_parser")) and tools:
            text, calls = await client.parse_function_call(session, url, text, tools, parser, timeout)
        return AssistantTurn(text, reasoning, tuple(calls))


SGLANG = SGLangEngine()
