"""POST /webhook through Flask's test client against real Redis and GitHub's own examples."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from redis import Redis
from rq import Queue

from app import create_app
from bot import inbox, webhooks
from contract import keys
from contract.settings import Settings
from fakehub.schema import webhook_examples

SECRET = "It's a Secret to Everybody"


def real_examples() -> list[tuple[str, dict[str, Any]]]:
    """(event, payload) for every example GitHub documents."""
    return webhook_examples()


@pytest.fixture
def client(redis_conn: Redis, redis_url: str):
    settings = Settings(redis_url=redis_url, webhook_secret=SECRET, max_body_bytes=1024 * 1024)
    app = create_app(settings, redis=redis_conn)
    return app.test_client()


def post(
    client,
    body: bytes,
    event: str = "pull_request",
    *,
    secret: str = SECRET,
    delivery: str | None = None,
    signature: str | None = None,
):
    headers = {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": signature or webhooks.signature_of(secret, body),
        "Content-Type": "application/json",
    }
    return client.post("/webhook", data=body, headers=headers)


def test_signature_matches_githubs_documented_example() -> None:
    # From GitHub's "Validating webhook deliveries" docs: secret, body and expected header.
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert webhooks.signature_of(SECRET, b"Hello, World!") == expected
    assert webhooks.verify_signature(SECRET, b"Hello, World!", expected)
    assert not webhooks.verify_signature(SECRET, b"Hello, World?", expected)
    assert not webhooks.verify_signature("", b"Hello, World!", expected)


@pytest.mark.parametrize(("event", "payload"), real_examples())
def test_every_real_example_gets_a_non_5xx_answer(client, redis_conn, event, payload) -> None:
    response = post(client, json.dumps(payload).encode(), event)
    assert response.status_code < 500
    if event == "ping":
        assert response.status_code == 200
    else:
        assert response.status_code == 202
        assert inbox.pending(redis_conn) == (1 if event in webhooks.HANDLED_EVENTS else 0)


def test_accepted_delivery_becomes_a_job_with_plain_values(client, redis_conn) -> None:
    payload = {"action": "opened", "number": 7}
    delivery = str(uuid.uuid4())
    assert post(client, json.dumps(payload).encode(), delivery=delivery).status_code == 202
    assert Queue(inbox.EVENTS_QUEUE, connection=redis_conn).count == 0  # the pump makes jobs
    assert inbox.Pump(redis_conn).drain() == 1
    (job,) = Queue(inbox.EVENTS_QUEUE, connection=redis_conn).get_jobs()
    assert job.id == f"delivery-{delivery}"
    assert job.func_name == inbox.HANDLER
    assert job.args == ("pull_request", delivery, payload)
    assert job.retries_left == len(inbox.DELIVERY_RETRY_S)  # a failed handling is retried
    assert inbox.pending(redis_conn) == 0
    counts = redis_conn.hgetall(keys.webhook_counts())
    assert counts == {b"pull_request:queued": b"1"}


def test_repeated_delivery_is_accepted_but_queued_once(client, redis_conn) -> None:
    body, delivery = b'{"action": "opened"}', str(uuid.uuid4())
    first = post(client, body, delivery=delivery)
    second = post(client, body, delivery=delivery)
    assert (first.status_code, second.status_code) == (202, 202)
    assert second.get_json()["duplicate"] is True
    assert inbox.pending(redis_conn) == 1
    counts = redis_conn.hgetall(keys.webhook_counts())
    assert counts == {b"pull_request:queued": b"1", b"pull_request:duplicate": b"1"}


def test_the_same_body_under_new_delivery_ids_is_queued_once(client, redis_conn, caplog) -> None:
    """A captured delivery replayed with fresh X-GitHub-Delivery ids (the signature covers
    only the body) is acknowledged but never queued again; other bodies still are."""
    body = b'{"action": "created", "comment": {"body": "/gpuci run all"}}'
    answers = [post(client, body, "issue_comment") for _ in range(3)]
    assert [a.status_code for a in answers] == [202, 202, 202]
    assert [a.get_json().get("duplicate", False) for a in answers] == [False, True, True]
    assert post(client, body.replace(b"all", b"2"), "issue_comment").get_json()["handled"]
    assert post(client, body, "pull_request").get_json()["duplicate"]  # another event name too
    assert inbox.pending(redis_conn) == 2
    counts = redis_conn.hgetall(keys.webhook_counts())
    assert counts[b"issue_comment:queued"] == b"2"
    assert counts[b"issue_comment:replayed"] == b"2"
    assert counts[b"pull_request:replayed"] == b"1"
    assert caplog.text.count("the same body came under another delivery id") == 3
    assert 0 < redis_conn.ttl(inbox.body_key(body)) <= inbox.DELIVERY_TTL_S


def test_githubs_redelivery_of_a_replayed_body_is_a_duplicate(client, redis_conn) -> None:
    body, delivery = b'{"action": "opened"}', str(uuid.uuid4())
    assert post(client, body, delivery=delivery).get_json()["handled"]
    assert post(client, body, delivery=delivery).get_json()["duplicate"]
    counts = redis_conn.hgetall(keys.webhook_counts())
    assert counts == {b"pull_request:queued": b"1", b"pull_request:duplicate": b"1"}


@pytest.mark.parametrize(
    ("change", "status", "message"),
    [
        ({"signature": "sha256=" + "0" * 64}, 401, "signature"),
        ({"secret": "wrong secret"}, 401, "signature"),
        ({"event": ""}, 400, "X-GitHub-Event"),
    ],
)
def test_bad_deliveries_are_refused_with_reason(
    client, redis_conn, change, status, message
) -> None:
    response = post(client, b'{"action": "opened"}', **change)
    assert response.status_code == status
    assert message in response.get_json()["error"]
    assert inbox.pending(redis_conn) == 0


@pytest.mark.parametrize(
    ("header", "words"),
    [
        ("sha256=" + "\u00e9" * 64, "malformed"),
        ("sha256=\u2603", "malformed"),
        ("\udcff\udcfe", "malformed"),
        ("sha256=" + "A" * 64, "malformed"),
        ("sha256=" + "0" * 64, "wrong"),
    ],
    ids=["latin-1", "snowman", "lone-surrogates", "upper-case", "zeros"],
)
def test_a_non_ascii_or_malformed_signature_is_401_with_a_reason(
    client, redis_conn, header: str, words: str
) -> None:
    body = b'{"action": "opened"}'
    assert not webhooks.verify_signature(SECRET, body, header)
    response = post(client, body, signature=header)
    assert response.status_code == 401
    assert words in response.get_json()["error"]
    assert "X-Hub-Signature-256" in response.get_json()["error"]
    assert inbox.pending(redis_conn) == 0


def test_missing_signature_header_is_401(client) -> None:
    response = client.post(
        "/webhook", data=b"{}", headers={"X-GitHub-Event": "ping", "X-GitHub-Delivery": "1"}
    )
    assert response.status_code == 401


@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe\x00", b"[1, 2]", b""])
def test_malformed_body_is_400(client, body: bytes) -> None:
    response = post(client, body)
    assert response.status_code == 400
    assert "JSON" in response.get_json()["error"]


def test_oversized_body_is_413_before_anything_else(client) -> None:
    body = b'{"pad": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    response = post(client, body)
    assert response.status_code == 413
    assert response.is_json


def test_redis_down_is_503_and_nothing_is_remembered(redis_conn) -> None:
    dead = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    app = create_app(Settings(webhook_secret=SECRET), redis=dead)
    response = post(app.test_client(), b'{"action": "opened"}')
    assert response.status_code == 503
    assert "retry" in response.get_json()["error"]


def test_unknown_route_and_method_are_json_errors(client) -> None:
    assert client.get("/nope").status_code == 404
    response = client.get("/webhook")
    assert response.status_code == 405
    assert response.is_json


def test_healthz_reports_redis(client, redis_conn) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.get_json()["redis"] == "ok"


def test_a_body_shorter_than_its_content_length_is_400(client, redis_conn) -> None:
    response = client.post(
        "/webhook", data=b'{"a": 1}', environ_overrides={"CONTENT_LENGTH": "100"}
    )
    assert response.status_code == 400
    assert "Content-Length" in response.get_json()["error"]
    assert inbox.pending(redis_conn) == 0


@pytest.mark.parametrize(
    ("error", "status", "words"),
    [(OSError("connection reset"), 400, "body ended"), (RuntimeError("bug"), 500, "web log")],
)
def test_a_broken_request_stream_gets_a_json_answer(
    client, caplog, error: Exception, status: int, words: str
) -> None:
    class Broken:
        def read(self, *args: object) -> bytes:
            raise error

    overrides = {"wsgi.input": Broken(), "wsgi.input_terminated": True}
    response = client.post("/webhook", data=b"{}", environ_overrides=overrides)
    assert response.status_code == status
    assert words in response.get_json()["error"]
    assert ("unexpected error receiving a delivery" in caplog.text) == (status == 500)
