"""The checks before any data is generated, and when an endpoint comes back.

Every endpoint's identity is read and must be the run's target (:mod:`eagle3_raw.run.target`): the
same model, the same rendering facts when it renders the prompts, and limits no tighter than the
ones the requests are fitted to. A server started with ``--preferred-sampling-params`` that would
fill in a key the recipe leaves out is refused. The server's tokenizer must agree with the recipe's
on a probe text (when the server can tokenize), and prompts rendered here must be the server's own
on real conversations from the source (when the server can render: :meth:`ServerChecks.check_rendering`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from eagle3_raw.engines import engine_named
from eagle3_raw.errors import (
    EndpointNotFound,
    PromptFormatError,
    RequestRejected,
    RetryableError,
    RowError,
    ServerMismatch,
    ServerUnreachable,
)
from eagle3_raw.run.render import generation_points
from eagle3_raw.run.retry import backoff
from eagle3_raw.run.target import cannot_render, target_of
from eagle3_raw.serving import ServerIdentity
from eagle3_raw.sglang.sampling import MANAGED_SAMPLING_KEYS
from eagle3_raw.source.prompts import Conversation as Conv
from eagle3_raw.source.prompts import iter_conversations

if TYPE_CHECKING:
    import aiohttp

    from eagle3_raw.identity import Target
    from eagle3_raw.recipe import Recipe
    from eagle3_raw.run.render import Renderer
    from eagle3_raw.source.prompts import Conversation

log = logging.getLogger("eagle3_raw")

_TOKENIZE_ATTEMPTS = 3
# Preferred sampling params that cannot change a row: every job sends its own sampling_seed, and
# stream_interval only paces streamed replies.
_HARMLESS_PREFERRED = frozenset({"sampling_seed", "stream_interval"})


class ServerChecks:
    """Start-up and re-admission checks of a run's endpoints against its target and recipe."""

    def __init__(
        self, recipe: Recipe, renderer: Renderer, session: aiohttp.ClientSession, target: Target
    ) -> None:
        self.recipe = recipe
        self.renderer = renderer
        self.session = session
        self.target = target
        self.engine = engine_named(target.engine)
        self._probe: tuple[str, list[int]] | None = None

    async def connect(self, urls: Sequence[str]) -> tuple[list[ServerIdentity], list[str]]:
        """The identities of the endpoints that answer, each checked, and the URLs that do not.

        ServerUnreachable when none answers; ServerMismatch when one is not the target."""
        timeout = self.recipe.server.connect_timeout
        results = await asyncio.gather(
            *(self.engine.server_identity(self.session, url, timeout) for url in urls), return_exceptions=True
        )
        identities = [r for r in results if isinstance(r, ServerIdentity)]
        errors = [(u, r) for u, r in zip(urls, results, strict=True) if isinstance(r, BaseException)]
        for _url, error in errors:
            if not isinstance(error, ServerUnreachable):
                raise error
        if not identities:
            raise ServerUnreachable("no endpoint answered: " + "; ".join(str(e) for _, e in errors))
        for url, error in errors:
            log.warning("endpoint %s is not answering (%s); continuing without it until it does", url, error)
        for identity in identities:
            self.check_identity(identity)
        return identities, [url for url, _ in errors]

    def check_identity(self, identity: ServerIdentity) -> None:
        """ServerMismatch unless ``identity`` serves the target within its limits, and its preferred
        sampling params change nothing the recipe sends."""
        served = target_of([identity])
        if self.target.render == "server" and dict(served.renderer) != dict(self.target.renderer):
            raise ServerMismatch(
                f"{identity.url} renders chat requests with {dict(served.renderer)}, but this set's prompts "
                f"come from a server rendering with {dict(self.target.renderer)}"
            )
        if dict(served.model) != dict(self.target.model) or served.engine != self.target.engine:
            raise ServerMismatch(
                f"{identity.url} serves {served.describe()}, but this set's rows come from "
                f"{self.target.describe()}; a server of another model, weights, engine or version "
                "makes another set: point the build at the right server (its rows are kept apart by "
                "the set's config id, so nothing mixes)"
            )
        if dict(served.drafter) != dict(self.target.drafter):
            raise ServerMismatch(
                f"{identity.url} runs drafter {dict(served.drafter) or 'none'}, but this set's acceptance "
                f"figures come from drafter {dict(self.target.drafter) or 'none'}: point the build at a "
                "server running the set's drafter (another drafter makes another set)"
            )
        for name, theirs, ours in (
            ("context", served.token_budget, self.target.token_budget),
            ("longest prompt", served.input_limit, self.target.input_limit),
        ):
            if ours is not None and (theirs is None or theirs < ours):
                raise ServerMismatch(
                    f"{identity.url} accepts a {name} of {theirs} tokens, less than the {ours} this set's "
                    "requests are fitted to; a server configured otherwise makes another set"
                )
        check_preferred_sampling(identity, self.recipe.sampling.request_params())

    async def check_tokenizers(self, identities: Sequence[ServerIdentity]) -> None:
        for identity in identities:
            await self.check_tokenizer(identity)

    async def check_tokenizer(self, identity: ServerIdentity) -> None:
        """ServerMismatch unless the server's ``/tokenize`` agrees with our tokenizer on a probe text,
        or the check cannot be made at all (``--skip-tokenizer-init``, no ``/tokenize``)."""
        url = identity.url
        if identity.skips_tokenizer_init:
            log.warning("%s runs with --skip-tokenizer-init: its tokenizer cannot be compared with %r; "
                        "make sure they are the same", url, self.recipe.model.tokenizer)  # fmt: skip
            return
        text, ours = self._tokenizer_probe()
        theirs = await self._server_tokenization(url, text)
        if theirs is not None and list(theirs) != list(ours):
            raise ServerMismatch(_tokenizer_mismatch(url, self.recipe.model.tokenizer, ours, theirs))

    def _tokenizer_probe(self) -> tuple[str, list[int]]:
        if self._probe is None:
            text = tokenizer_probe(self.renderer)
            self._probe = (
                text,
                self.renderer.tokenizer.encode(text, add_special_tokens=False, verbose=False),
            )
        return self._probe

    async def _server_tokenization(self, url: str, text: str) -> list[int] | None:
        """``/tokenize`` of ``text``, retried while transient; None when the server has no
        ``/tokenize`` (an HTTP 404, e.g. a router that does not forward it)."""
        timeout, attempts = self.recipe.server.connect_timeout, 0
        while True:
            try:
                return await self.engine.tokenize(self.session, url, text, timeout)
            except EndpointNotFound:
                log.warning("%s has no /tokenize: its tokenizer cannot be compared with %r; make sure "
                            "they are the same", url, self.recipe.model.tokenizer)  # fmt: skip
                return None
            except RetryableError as exc:
                attempts += 1
                if attempts == _TOKENIZE_ATTEMPTS:
                    raise ServerMismatch(_untestable_tokenizer(url, exc)) from exc
                await asyncio.sleep(backoff(attempts))
            except RowError as exc:
                raise ServerMismatch(_untestable_tokenizer(url, exc)) from exc

    async def check_rendering(self, url: str, conversations: Sequence[Conversation]) -> None:
        """ServerMismatch, naming the row, the position and both sides' tokens there, unless every
        prompt of ``conversations`` renders here exactly as the server's chat path renders it.

        Nothing to compare (a warning) when the server cannot render chat requests."""
        identity = await self.engine.server_identity(self.session, url, self.recipe.server.connect_timeout)
        why = await cannot_render(self.session, identity, self.recipe.server.connect_timeout)
        if why:
            log.warning("prompts render here and cannot be checked against %s (%s)", url, why)
            return
        for conv in conversations:
            for turn in generation_points(conv.messages, self.recipe.turns)[:3]:
                await self._compare_render(url, conv, turn)

    async def _compare_render(self, url: str, conv: Conversation, turn: int) -> None:
        try:
            # off the event loop: a slow template must not keep Ctrl-C and SIGTERM from being handled
            ours: list[int] | str = await asyncio.to_thread(self.renderer.prompt_ids, conv, turn)
        except PromptFormatError as exc:
            ours = f"refused ({exc})"
        body = self.renderer.chat_request(conv, turn)
        try:
            theirs: list[int] | str = await self.engine.tokenize_chat(
                self.session, url, body, self.recipe.server.request_timeout
            )
        except RequestRejected as exc:
            theirs = f"refused ({exc})"
        if isinstance(ours, str) and isinstance(theirs, str):
            return  # both refuse it: the row is skipped either way
        if ours != theirs:
            raise ServerMismatch(_render_mismatch(self.renderer, url, conv, turn, ours, theirs))

    async def readmit(self, url: str) -> bool:
        """Whether an endpoint that was out may take requests: it answers ``/health`` and is the
        run's target (model, weights, SGLang version, limits, tokenizer), checked every time."""
        timeout = self.recipe.server.connect_timeout
        if not await self.engine.health(self.session, url, timeout):
            return False
        try:
            identity = await self.engine.server_identity(self.session, url, timeout)
            self.check_identity(identity)
            await self.check_tokenizer(identity)
        except (ServerUnreachable, ServerMismatch, RetryableError, RowError) as exc:
            log.warning("endpoint %s answers /health but stays out: %s", url, exc)
            return False
        return True


def check_preferred_sampling(identity: ServerIdentity, sent: Mapping[str, Any]) -> None:
    """ServerMismatch if the server's ``--preferred-sampling-params`` would fill in keys our requests
    leave out: the rows would change without the recipe (or its fingerprint) changing."""
    preferred = identity.preferred_sampling_params
    taken = sorted(k for k in preferred if k not in sent and k not in _HARMLESS_PREFERRED)
    if not taken:
        return
    settable = [f"sampling.{k}" for k in taken if k not in MANAGED_SAMPLING_KEYS]
    advice = f"set {', '.join(settable)} in the recipe, or restart" if settable else "restart"
    given = ", ".join(f"{k}={preferred[k]!r}" for k in taken)
    raise ServerMismatch(
        f"{identity.url} was started with --preferred-sampling-params that SGLang applies to every "
        f"request leaving them out ({given}); the rows would change without the recipe changing: "
        f"{advice} the server without them"
    )


def tokenizer_probe(renderer: Renderer, samples: int = 4096) -> str:
    """A text that exercises the tokenizer: special tokens, common words, code, digits, non-ASCII,
    and the decoded text of ``samples`` ids spread over the whole vocabulary."""
    tokenizer = renderer.tokenizer
    specials = "".join(tokenizer.all_special_tokens[:8])
    step = max(1, renderer.vocab_size // samples)
    spread = tokenizer.decode(list(range(0, renderer.vocab_size, step)), skip_special_tokens=True)
    return (
        f"{specials}Hello, world! The quick brown fox jumps over 13 lazy dogs; the cat and the dog "
        "sat in a box for it was on the mat, as is that with this.\n"
        "def f(x):\n    return x ** 2  # naïve café, 東京, emoji 🙂\n"
        f'{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}\n{spread}'
    )


def _untestable_tokenizer(url: str, exc: Exception) -> str:
    return (
        f"cannot check that {url} tokenizes like the recipe's tokenizer: /tokenize failed ({exc}); "
        "without that check every row could be tokenized for another model. Fix the server and run again"
    )


def sample_conversations(recipe: Recipe, *, scan: int = 200, most: int = 12) -> list[Conversation]:
    """Real conversations from the start of the source to check rendering on: those with tools,
    those with several assistant turns, those with reasoning, then the first others."""
    import itertools

    rows = [c for c in itertools.islice(iter_conversations(recipe), scan) if isinstance(c, Conv)]

    def kinds(c: Conversation) -> tuple[bool, bool, bool]:
        assistants = [m for m in c.messages if m["role"] == "assistant"]
        return (bool(c.tools), len(assistants) > 1, any("reasoning_content" in m for m in assistants))

    chosen: list[Conversation] = []
    for position in range(3):
        chosen += [c for c in rows if kinds(c)[position] and c not in chosen][:4]
    chosen += [c for c in rows if c not in chosen][: max(0, most - len(chosen))]
    return chosen[:most]


def _render_mismatch(
    renderer: Renderer,
    url: str,
    conv: Conversation,
    turn: int,
    ours: list[int] | str,
    theirs: list[int] | str,
) -> str:
    head = (
        f"prompts rendered here differ from the server's chat path at {url} on row {conv.source_id!r} "
        f"turn {turn}: "
    )
    if isinstance(ours, str) or isinstance(theirs, str):
        here = ours if isinstance(ours, str) else "rendered"
        return head + f"here {here}, the server {theirs if isinstance(theirs, str) else 'rendered'}"
    at = next(
        (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs))
    )
    decode = renderer.tokenizer.decode

    def around(ids: list[int]) -> str:
        return repr(decode(ids[max(0, at - 8) : at])) + " | " + repr(decode(ids[at : at + 8]))

    return head + (
        f"first difference at token {at} (of {len(ours)} here, {len(theirs)} there): here {around(ours)}; "
        f"the server {around(theirs)}. The rows would not be the prompts the deployed server feeds the "
        "model: render them on the server (model.render: server), or fix the tokenizer or template"
    )


def _tokenizer_mismatch(url: str, name: str, ours: Sequence[int], theirs: Sequence[int]) -> str:
    first = next(
        (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs))
    )
    return (
        f"the server at {url} tokenizes differently from model.tokenizer={name!r}: first difference at "
        f"token {first} (ours {list(ours[first : first + 5])}, server {list(theirs[first : first + 5])}). "
        "The rows would not be the model's own tokens; point the recipe at the tokenizer the server runs."
    )
