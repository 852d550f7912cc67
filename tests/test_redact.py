"""Redaction of every form a secret takes in a command line or free text (issue 13, finding 11)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3_raw import redact
from eagle3_raw.redact import REDACTED, scrub, scrub_args, scrub_text

KEY = "s3cr3t-e3raw-value"


@pytest.mark.parametrize(
    "text",
    [
        f"--api-key {KEY} --port 1",
        f"--api-key=-{KEY} --port 1",
        f"--api-key -{KEY} --port 1",  # a value that starts with "-"
        f"--admin-api-key='{KEY}'",
        f'--json-model-override-args {{"api_key": "{KEY}", "dtype": "bf16"}}',  # JSON-valued argument
        f"--hf-overrides {{'hf_token':'{KEY}'}}",
        f"api_key = {KEY}",  # key = value, with spaces
        f"HF_TOKEN={KEY} python -m x",
        f"export SGLANG_API_KEY = {KEY}",
        f"aws_secret_access_key={KEY}",
        f"see https://user:{KEY}@host/x",
        f"Authorization: Bearer {KEY}",
    ],
)
def test_secret_flags_assignments_and_json_values_are_redacted(text: str) -> None:
    clean = scrub_text(text)
    assert KEY not in clean and REDACTED in clean, clean


@pytest.mark.parametrize(
    "key",
    [
        "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx1234",
        "sk-ant-api03-AbCdEfGhIjKlMnOpQrSt",
        "AKIAIOSFODNN7EXAMPLE",
        "hf_AbCdEfGhIjKlMnOpQrStUv",
        "ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
        "xoxb-1234567890-abcdefghij",
    ],
)
def test_bare_keys_in_free_text_are_redacted(key: str) -> None:
    assert scrub_text(f"the server said: bad credentials {key}, try again") == (
        f"the server said: bad credentials {REDACTED}, try again"
    )


def test_argument_lists_redact_a_value_starting_with_a_dash_and_json_arguments() -> None:
    args = [
        "--api-key",
        f"-{KEY}",
        "--preferred-sampling-params",
        f'{{"token": "{KEY}", "top_p": 1}}',
        "--port",
        "1",
    ]
    clean = scrub_args(args)
    assert KEY not in " ".join(clean)
    assert clean[0] == "--api-key" and clean[1] == REDACTED and clean[4:] == ["--port", "1"]
    assert clean[3] == f'{{"token": "{REDACTED}", "top_p": 1}}'


def test_a_secret_flag_followed_by_another_flag_takes_no_value() -> None:
    assert scrub_args(["--api-key", "--port", "1"]) == ["--api-key", "--port", "1"]


@pytest.mark.parametrize(
    "text",
    [
        "max_total_num_tokens=5 tokenizer_path=/m --max-running-requests 8",
        "bad token id 600 at position 3",
        "missing key 'x' in row 4",
        '{"prompt_tokens": 5, "skip_tokenizer_init": true}',
        "--tokenizer-path /models/qwen --skip-tokenizer-init",
    ],
)
def test_what_is_not_a_secret_stays(text: str) -> None:
    assert scrub_text(text) == text


def test_scrub_redacts_inside_nested_values() -> None:
    clean = scrub({"launch_command": f"serve --api-key {KEY}", "args": ["--api-key", KEY], "api_key": KEY})
    assert KEY not in str(clean) and "api_key" not in clean


def test_a_launch_command_is_published_without_install_paths() -> None:
    """Issue 21, finding 9: the manifest's ``launch_command`` named the local install path."""
    main = Path(redact.__file__).parent / "reference" / "__main__.py"  # what -m puts in sys.argv[0]
    reference = redact.public_command(f"{main} --port 1 --ledger /home/a/l.jsonl --api-key {KEY}")
    assert reference == "python -m eagle3_raw.reference --port 1 --ledger l.jsonl --api-key <redacted>"
    sglang = "/home/a/venv/bin/python3.11 -m sglang.launch_server --model-path /models/Qwen3-8B --tp 8"
    assert redact.public_command(sglang) == "python -m sglang.launch_server --model-path Qwen3-8B --tp 8"
    script = "/opt/venv/bin/python /opt/venv/lib/python3.11/site-packages/sglang/launch_server.py --x=/a/b"
    assert redact.public_command(script) == "python -m sglang.launch_server --x=b"
    assert redact.public_command("/usr/local/bin/sglang serve") == "sglang serve"
    assert redact.public_command('not "a command') == 'not "a command'
