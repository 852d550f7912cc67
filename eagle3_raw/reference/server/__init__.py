"""The SGLang-compatible reference server: SGLang 0.5.23's native HTTP API over the tiny engine.

Held to ``shared/sglang-protocol.md``: ``/generate`` (single, batch, ``n > 1``, SSE streams, the
three error shapes, context refusals and the silent ``max_new_tokens`` clip) and the side endpoints
(``/health``, ``/model_info``, ``/server_info``, ``/v1/models``, ``/tokenize``, ``/detokenize``,
``/flush_cache``, ``/abort_request``, ``/v1/loads``). On top, for tests and benchmarks: injected
faults (:mod:`eagle3_raw.reference.faults`), capacity mode (:mod:`eagle3_raw.reference.capacity`),
the ledger (:mod:`eagle3_raw.reference.ledger`), and ``GET /reference/stats`` /
``POST /reference/stats/reset``. The request semantics live in :mod:`eagle3_raw.sglang.protocol`;
this package is the HTTP side:

- :mod:`.config` ``ServerConfig``, :mod:`.model` the served model, :mod:`.state` what handlers share;
- ``/generate``: :mod:`.generate` (the handler), :mod:`.planning` (items to planned jobs),
  :mod:`.runner` (inline or under the capacity slots), :mod:`.jobs` (a generation and its response
  object), :mod:`.replies` (sending, refusals, faults, ledger lines), :mod:`.streaming` (SSE);
- side endpoints: :mod:`.info` (health, model/server info, models, loads, stats), :mod:`.utility`
  (tokenize, detokenize, flush_cache, abort_request) with :mod:`.tokenize` (chat ``messages``),
  :mod:`.parsing` (``/separate_reasoning``, ``/parse_function_call``);
- :mod:`.app`: routes, middleware and :func:`serve`.
"""

from eagle3_raw.reference.server.app import build_app, serve
from eagle3_raw.reference.server.config import ServerConfig
from eagle3_raw.reference.server.model import Model
from eagle3_raw.reference.server.state import ServerState

__all__ = ["Model", "ServerConfig", "ServerState", "build_app", "serve"]
