"""Credentials in URLs and query strings (contract/redact.py), and the places that use it: the
test environment's scrubber and the CLI's messages."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bot.cli import main
from bot.redis_local import free_port
from contract.redact import REDACTED, has_credentials, redact_query, redact_text, redact_url
from workers.runner import is_secret
from workers.source import SourceError, fetch_archive

R = REDACTED

# text -> the same text with its credentials redacted
REDACTIONS = [
    ("redis://:hunter2@10.0.0.5:6379/0", f"redis://{R}@10.0.0.5:6379/0"),
    ("redis://gpuci:hunter2@redis.internal/1", f"redis://{R}@redis.internal/1"),
    ("https://ghp_key1234@pypi.example/simple", f"https://{R}@pypi.example/simple"),
    ("https://user:p@ss@host/x", f"https://{R}@host/x"),
    ("https://api.example/v1?token=abc123&page=2", f"https://api.example/v1?token={R}&page=2"),
    ("https://db.example/?password=s3cret", f"https://db.example/?password={R}"),
    ("https://x.example/?api_key=k&apiKey=k2&sig=zz", f"https://x.example/?api_key={R}&apiKey={R}&sig={R}"),
    ("https://s3.example/o?X-Amz-Signature=ab&X-Amz-Credential=cd", f"https://s3.example/o?X-Amz-Signature={R}&X-Amz-Credential={R}"),
    ("https://app.example/cb#access_token=t0k&state=1", f"https://app.example/cb#access_token={R}&state=1"),
    ("index https://a:b@one/simple and https://two/?token=t", f"index https://{R}@one/simple and https://two/?token={R}"),
    ("GET /runs/4?token=tok3n&x=1 HTTP/1.1", f"GET /runs/4?token={R}&x=1 HTTP/1.1"),
    ("http://[::1:6379?password=pw", f"http://[::1:6379?password={R}"),
]  # fmt: skip

# texts without any credential: left exactly as they are
CLEAN = [
    "https://pypi.org/simple",
    "https://hf.co/api/models?revision=main&limit=5",
    "http://host/path@not-userinfo",
    "git@github.com:acme/gpu.git",
    "alice@example.com",
    "/usr/bin:/bin",
    "https://x.example/?token=",
    "C.UTF-8",
]


@pytest.mark.parametrize(("text", "redacted"), REDACTIONS)
def test_credentials_in_urls_and_queries_are_redacted(text: str, redacted: str) -> None:
    assert redact_text(text) == redacted
    assert has_credentials(text)
    assert redact_text(redacted) == redacted  # redacting twice changes nothing more


@pytest.mark.parametrize("text", CLEAN)
def test_text_without_credentials_is_left_alone(text: str) -> None:
    assert redact_text(text) == text
    assert not has_credentials(text)


def test_url_and_query_forms() -> None:
    assert redact_url("redis://:pw@h/0") == f"redis://{R}@h/0"
    assert redact_query("a=1&token=x;secret=y") == f"a=1&token={R};secret={R}"
    assert redact_query("novalue&token") == "novalue&token"


@pytest.mark.parametrize(
    "value",
    [
        "redis://:hunter2@10.0.0.5:6379/0",
        "https://deploykey@git.example/acme/gpu.git",
        "https://mirror.example/simple?token=abc",
        "https://db.example/?password=s3cret",
        "see https://api.example/?access_token=t for details",
    ],
)
def test_environment_scrubber_drops_values_holding_url_credentials(value: str) -> None:
    assert is_secret("SOME_MIRROR", value)


@pytest.mark.parametrize("value", CLEAN)
def test_environment_scrubber_keeps_values_without_credentials(value: str) -> None:
    assert not is_secret("SOME_MIRROR", value)


def test_cli_messages_never_show_the_redis_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://:hunter2@127.0.0.1:1/0")
    assert main(["runs"]) != 0
    err = capsys.readouterr().err
    assert "unreachable" in err
    assert "hunter2" not in err
    assert f"redis://{R}@127.0.0.1:1/0" in err


def test_a_failed_download_does_not_show_the_links_token(tmp_path: Path) -> None:
    """GitHub answers the tarball request with a redirect to a link holding a token; when
    that link cannot be fetched, the error (shown in the Check Run) names it redacted."""
    dead = free_port()

    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{dead}/x.tar.gz?token=LINKSECRET")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        api = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(SourceError, match="could not download") as caught:
            fetch_archive(api, "acme/gpu", "a" * 40, "ghs_token", tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    assert "LINKSECRET" not in str(caught.value)
    assert f"x.tar.gz?token={R}" in str(caught.value)
