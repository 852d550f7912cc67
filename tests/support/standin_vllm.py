"""A stand-in for vLLM's OpenAI server in the launcher's tests: ``server.vllm.executable:
[python, tests/support/standin_vllm.py]``.

It reads the flags the launcher writes (``--host``, ``--port``, any others kept as given), answers
``GET /health`` with 200 and ``GET /v1/models`` (401 without the key when ``VLLM_API_KEY`` is
set, as vLLM does), and stops on SIGTERM. At start it writes what it was given to
``$E3_STANDIN_DIR/standin-<pid>.json``: its arguments and the variables eagle3_raw manages.
``--fail-at-start`` makes it exit with code 2 first, saying so, like a server refusing its flags;
``--ignore-sigterm`` keeps it running through SIGTERM (only SIGKILL stops it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RECORDED_ENV = ("VLLM_API_KEY", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "VLLM_SERVER_DEV_MODE", "E3_EXTRA")


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fail-at-start", action="store_true")
    parser.add_argument("--ignore-sigterm", action="store_true")
    args, _ = parser.parse_known_args()
    if args.fail_at_start:
        print("error: unrecognized arguments: --fail-at-start (pretend)", file=sys.stderr, flush=True)
        return 2
    record = {"argv": sys.argv[1:], "env": {name: os.environ.get(name) for name in RECORDED_ENV}}
    folder = Path(os.environ["E3_STANDIN_DIR"])
    (folder / f"standin-{os.getpid()}.json").write_text(json.dumps(record))
    key = os.environ.get("VLLM_API_KEY") or ""
    server = ThreadingHTTPServer((args.host, args.port), _handler(key))
    stop = threading.Event()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop.wait()
    server.shutdown()
    return 0


def _handler(key: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self._answer(200, b"")
            elif self.path == "/v1/models":
                if key and self.headers.get("Authorization") != f"Bearer {key}":
                    self._answer(401, b'{"error": "Unauthorized"}')
                else:
                    self._answer(200, b'{"object": "list", "data": []}')
            else:
                self._answer(404, b"{}")

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


if __name__ == "__main__":
    sys.exit(main())
