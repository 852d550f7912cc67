"""One generation of a request (a prompt x sample): :class:`Job`, from its plan to its outcome, and
the response object (or stream chunk) SGLang sends for it, keys in SGLang's order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eagle3_raw.reference.capacity import Ticket
from eagle3_raw.reference.server.model import Model
from eagle3_raw.reference.speculation import Drafter
from eagle3_raw.sglang import protocol as p


@dataclass(eq=False)
class Job:
    """One generation of a request (a prompt x sample), from its plan to its outcome."""

    index: int
    spec: p.ItemSpec
    input_ids: list[int]
    sampling: p.Sampling
    interval: int
    ticket: Ticket | None = None
    cached: int = 0
    planned: list[int] = field(default_factory=list)
    planned_finish: dict[str, Any] = field(default_factory=dict)
    output_ids: list[int] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    queued: bool = False
    """Ended before leaving the queue (SGLang then sends a smaller ``meta_info``)."""
    ended: float = 0.0
    sent: bool = False

    def end(self, output_ids: list[int], finish: dict[str, Any], *, queued: bool = False) -> None:
        self.output_ids, self.finish, self.queued, self.ended = output_ids, finish, queued, time.monotonic()

    @property
    def refusal_status(self) -> int | None:
        """The HTTP status SGLang turns this generation's abort into (400/503), or None."""
        status = (self.finish or self.planned_finish).get("status_code")
        return status if isinstance(status, int) and status >= 400 else None


Emit = Callable[[Job, bool], None]
"""Called with each stream chunk a job produces (``False``) and once when it ends (``True``)."""


def no_emit(job: Job, final: bool) -> None:
    return None


def response_object(
    job: Job, model: Model, req: p.Normalized, received: float, final: bool, drafter: Drafter | None = None
) -> dict[str, Any]:
    """One response object (or stream chunk) of a job, SGLang's keys in SGLang's order.

    ``received`` is when the request arrived (``time.monotonic``), for ``e2e_latency``; with a
    ``drafter``, a finished generation's ``meta_info`` carries its speculative figures.
    """
    out: dict[str, Any] = {}
    if model.tokenizer is not None:
        out["text"] = _text(job, model, final)
    out["output_ids"] = job.output_ids
    if final and job.queued:
        meta = p.queued_abort_meta(job.spec.rid, job.finish or {}, job.ended - received, model.weight_version)
    else:
        finish = job.finish if final else None
        meta = p.meta_info(
            job.spec.rid, finish, len(job.input_ids), len(job.output_ids), job.cached, model.weight_version
        )
        if final:
            meta["e2e_latency"] = job.ended - received
            if drafter is not None:  # after e2e_latency, as SGLang adds them
                meta.update(drafter.figures(job.input_ids, job.output_ids))
        else:
            del meta["weight_versions"]  # SGLang sends them with the last chunk only
    if not job.sent:
        job.sent = True
        meta["response_sent_to_client_ts"] = time.time()
    out["meta_info"] = meta
    if req.return_prompt_token_ids:
        out["prompt_token_ids"] = job.input_ids
    return out


def _text(job: Job, model: Model, final: bool) -> str:
    if final:
        return p.output_text(job.output_ids, job.finish, job.sampling, model.decode)
    # A chunk may end inside a multi-byte character: drop the replacement characters it decodes to.
    return model.decode(job.output_ids, job.sampling.skip_special_tokens).rstrip("\ufffd")
