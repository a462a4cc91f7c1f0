"""Property tests: arbitrary input to the webhook, the config loader and the JUnit parser is
answered with a clear error, never an unhandled exception or a 5xx."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis import Redis

from app import create_app
from bot import webhooks
from contract.config import ConfigError, load_config
from contract.settings import Settings
from workers.junit import JUnitError, parse_junit

SECRET = "hostile"
QUICK = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

# Header text as a WSGI server hands it over: any latin-1 character but controls.
header_values = st.text(
    alphabet=st.characters(min_codepoint=32, max_codepoint=255, blacklist_categories=("Cc",)),
    max_size=80,
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@QUICK
@given(
    body=st.binary(max_size=2048) | json_values.map(lambda v: json.dumps(v).encode()),
    event=header_values,
    delivery=header_values,
    sign=st.booleans(),
    signature=header_values,
)
def test_webhook_never_answers_5xx(
    redis_conn: Redis, body: bytes, event: str, delivery: str, sign: bool, signature: str
) -> None:
    app = create_app(Settings(webhook_secret=SECRET, max_body_bytes=4096), redis=redis_conn)
    headers = {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": webhooks.signature_of(SECRET, body) if sign else signature,
    }
    response = app.test_client().post("/webhook", data=body, headers=headers)
    assert response.status_code < 500
    assert response.is_json
    if not sign:
        assert response.status_code == 401


yaml_like = st.text(
    alphabet=st.sampled_from(list("abc:{}[]-'\"#&*!|>%@ \n\t01:,.version batches gpus tests")),
    max_size=300,
)


@QUICK
@given(text=yaml_like | st.text(max_size=300))
def test_config_loader_raises_only_config_error(text: str) -> None:
    try:
        load_config(text, ".gpuci.yml")
    except ConfigError as exc:
        assert exc.issues
        assert all(issue.file == ".gpuci.yml" for issue in exc.issues)


xml_like = st.text(
    alphabet=st.sampled_from(list("<>/=\"' testcasuifkpdrom&;![]CDATA-?xml\n")), max_size=400
)


@QUICK
@given(data=xml_like.map(str.encode) | st.binary(max_size=400))
def test_junit_parser_raises_only_junit_error(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "junit.xml"
        path.write_bytes(data)
        try:
            summary = parse_junit([path])
        except JUnitError as exc:
            assert "junit.xml" in str(exc)
        else:
            # a file without a testcase element cannot count tests
            assert summary.tests == 0 or b"testcase" in data
