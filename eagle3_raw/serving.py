"""What every engine's client gives the run: a server's identity, a checked generation, a parsed
assistant turn, and the :class:`Engine` boundary itself.

The run (:mod:`eagle3_raw.run`) speaks to a server only through an :class:`Engine`
(:func:`eagle3_raw.engines.engine_named`): SGLang (:mod:`eagle3_raw.sglang`) and vLLM
(:mod:`eagle3_raw.vllm`) each implement it over their own routes, and each checks what its server
answers before it becomes one of these objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from aiohttp import ClientSession

ENGINE_LABELS: Mapping[str, str] = {"sglang": "SGLang", "vllm": "vLLM"}
"""Each engine's name as messages and the card print it."""


@dataclass(frozen=True)
class ServerIdentity:
    """What a server says about itself at the start of a run, in one form for every engine.

    ``server_info`` holds the facts worth keeping in the manifest under the names SGLang's
    ``/server_info`` gives them (``reasoning_parser``, ``tool_call_parser``, ``skip_tokenizer_init``,
    ``tokenizer_path``, ...), whichever engine reported them, plus the engine's own.
    """

    url: str
    model_path: str
    served_model_name: str
    weight_version: str
    version: str
    context_length: int | None
    max_req_input_len: int | None
    max_running_requests: int | None
    model_info: Mapping[str, Any] = field(default_factory=dict)
    server_info: Mapping[str, Any] = field(default_factory=dict)
    reserved_tokens: int = 0
    """Output slots reserved per request for EAGLE-style speculative decoding; SGLang counts them
    with the prompt against the context length (``compute_num_reserved_tokens``)."""
    preferred_sampling_params: Mapping[str, Any] = field(default_factory=dict)
    """``--preferred-sampling-params``: SGLang applies them to every request that leaves them out."""
    drafter: Mapping[str, Any] = field(default_factory=dict)
    """The drafter a speculating server runs, as it reports it; empty when it does not speculate."""
    engine: str = "sglang"
    """Which engine the server is (:data:`ENGINE_LABELS`)."""

    def comparable(self) -> dict[str, Any]:
        """The facts that must not change between a run and its resume (or across endpoints)."""
        facts = {
            "model_path": self.model_path,
            "served_model_name": self.served_model_name,
            "weight_version": self.weight_version,
            "version": self.version,
        }
        return facts if self.engine == "sglang" else {**facts, "engine": self.engine}

    @property
    def label(self) -> str:
        """The engine and its version, for messages (``SGLang 0.5.23``, ``vLLM 0.32.0``)."""
        return f"{ENGINE_LABELS.get(self.engine, self.engine)} {self.version}"

    @property
    def skips_tokenizer_init(self) -> bool:
        """``--skip-tokenizer-init``: the server neither tokenizes nor renders."""
        return self.server_info.get("skip_tokenizer_init") is True

    @property
    def reasoning_parser(self) -> str | None:
        """The reasoning parser the server's chat API uses, as it reports it (None: unset or unsaid)."""
        return _name(self.server_info.get("reasoning_parser"))

    @property
    def tool_call_parser(self) -> str | None:
        """The tool-call parser the server's chat API uses, as it reports it (None: unset or unsaid)."""
        return _name(self.server_info.get("tool_call_parser"))

    @property
    def tokenizer_path(self) -> str:
        """The tokenizer the server says it loaded ("" when it does not say)."""
        return str(self.model_info.get("tokenizer_path") or "")

    @property
    def token_budget(self) -> int | None:
        """Prompt plus ``max_new_tokens`` the server accepts: the context length less the reserved
        slots (SGLang refuses more with a 400, vLLM cuts the output short), if known."""
        return None if self.context_length is None else self.context_length - self.reserved_tokens

    @property
    def input_limit(self) -> int | None:
        """The longest prompt the server accepts (``max_req_input_len - 1``; SGLang §5, and below
        the token budget), if known."""
        budget = self.token_budget
        if self.max_req_input_len is not None:
            return self.max_req_input_len - 1 if budget is None else min(self.max_req_input_len, budget) - 1
        return None if budget is None else budget - 7


@dataclass(frozen=True)
class Generation:
    """A checked completion: the ids exactly as returned, and the facts worth keeping."""

    output_ids: list[int]
    finish_reason: str
    meta: Mapping[str, Any]
    text: str | None = None
    """The server's own decode of the output (what its chat API parses); None when it sent none."""


@dataclass(frozen=True)
class ToolCall:
    """One call the server's tool-call parser found: the tool's name and its arguments as a JSON string."""

    name: str
    parameters: str


@dataclass(frozen=True)
class AssistantTurn:
    """What the server's output parsers make of a generated turn: the assistant message its chat
    API would return (``content`` the text left, ``reasoning`` the reasoning part, ``calls``)."""

    content: str
    reasoning: str
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class TurnToSplit:
    """A generated turn to split into an :class:`AssistantTurn`: its ids, the server's text of
    them (None: journaled without it), how that text was decoded, and the chat request it answers
    (``messages`` and ``tools`` as sent to ``/tokenize``)."""

    output_ids: Sequence[int]
    text: str | None
    skip_special_tokens: bool
    finish_reason: str
    chat_request: Mapping[str, Any]


class Engine(Protocol):
    """One engine's client, as the run uses it (every method checks what the server answers).

    Errors are :mod:`eagle3_raw.errors` classes chosen by what the run should do: a
    :class:`~eagle3_raw.errors.RetryableError` (connection, timeout, 5xx, abort, a bad answer), a
    :class:`~eagle3_raw.errors.RequestRejected` (this request will never work), or a fatal error
    (credentials, no such route, a redirect).
    """

    name: str
    """``sglang`` or ``vllm``."""
    reasoning_field: str
    """The key of an assistant message's reasoning in the engine's chat API (``reasoning_content``
    for SGLang, ``reasoning`` for vLLM): a rollout's history sends it back under that key."""

    async def server_identity(self, session: ClientSession, url: str, timeout: float) -> ServerIdentity:
        """What the server at ``url`` reports about itself (ServerUnreachable when it does not answer,
        ServerMismatch when it is not this engine)."""
        ...

    async def health(self, session: ClientSession, url: str, timeout: float) -> bool:
        """Whether the server answers its health route with 200."""
        ...

    async def tokenize(self, session: ClientSession, url: str, text: str, timeout: float) -> list[int]:
        """The server's tokenization of ``text`` (no special tokens added)."""
        ...

    async def tokenize_chat(
        self, session: ClientSession, url: str, body: Mapping[str, Any], timeout: float
    ) -> list[int]:
        """The prompt ids the server's chat path makes of a chat request (``/tokenize`` with messages)."""
        ...

    async def generate(
        self, session: ClientSession, url: str, *, rid: str, input_ids: Sequence[int],
        sampling_params: Mapping[str, Any], vocab_size: int, timeout: float,
        eos_ids: frozenset[int] = frozenset(),
    ) -> Generation:  # fmt: skip
        """One generation of ``input_ids`` with the recipe's ``sampling_params`` (SGLang's names, as
        recipes write them), checked token by token against what was sent."""
        ...

    async def abort(self, session: ClientSession, url: str, rid: str, timeout: float = 2.0) -> None:
        """Ask the server to stop generating ``rid`` (best effort: errors are ignored)."""
        ...

    async def split_turn(
        self, session: ClientSession, url: str, turn: TurnToSplit, parsers: Mapping[str, str | None],
        timeout: float,
    ) -> AssistantTurn:  # fmt: skip
        """``turn`` as the server's output parsers (``parsers``: the reasoning and tool-call parser a
        rollout splits with) make it into the assistant message its chat API returns."""
        ...


def _name(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
