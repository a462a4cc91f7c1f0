"""The dashboard through Flask's test client against real Redis, with results from real pytest."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from markupsafe import escape
from redis import Redis

from app import create_app
from bot import hostlink, runs
from bot.dashboard import (
    COOKIE,
    GpuStatus,
    github_web_url,
    gpu_view,
    render_markdown,
    results_visible,
)
from bot.runs import Run, RunState, RunTrigger, load_result
from contract import keys, leases
from contract.config import load_config
from contract.hostlink import HostMessage, Kind
from contract.settings import Settings
from workers.batch import conclude_run
from workers.gpus import open_backend
from workers.host import publish_host
from workers.runner import RunOutcome

PLUGIN = Path(__file__).resolve().parent.parent / "workers" / "pytest_plugin"
SHA = "0123456789abcdef0123456789abcdef01234567"
HOSTILE = "<script>alert(1)</script>"
CONFIG = """\
version: 1
batches:
  "2": {gpus: 1, tests: [tests], timeout: 10m}
"""
SUITE = """\
import pytest


@pytest.mark.parametrize("dtype", ["fp16", "<script>alert(1)</script>"])
def test_kernel(dtype):
    assert dtype


def test_loss():
    assert "<b>nan</b>" == "0.0", "</pre><script>alert(2)</script>"


@pytest.mark.skip(reason="needs 4 GPUs")
def test_four_gpus():
    pass


@pytest.mark.xfail(reason="was flaky on H20")
def test_xpass():
    pass
"""


@dataclass
class PytestRun:
    """One real pytest run of SUITE: the files a GPU worker would summarize."""

    junit: Path
    report: Path
    stdout: str


def run_suite(tmp: Path) -> PytestRun:
    (tmp / "tests").mkdir(parents=True)
    (tmp / "pytest.ini").write_text("[pytest]\n")
    (tmp / "tests" / "test_model.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env["PYTHONPATH"] = str(PLUGIN)
    junit, report = tmp / "junit.xml", tmp / "report.jsonl"
    command = [sys.executable, "-m", "pytest", "-p", "gpuci_report", f"--gpuci-report={report}"]
    command += [f"--junitxml={junit}", "-o", "junit_family=xunit1", "-p", "no:cacheprovider"]
    command += ["-ra", "-v", "--color=no", "-p", "no:xdist", "tests"]
    done = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    return PytestRun(junit, report, done.stdout)


@pytest.fixture(scope="module")
def pytest_run(tmp_path_factory: pytest.TempPathFactory) -> PytestRun:
    return run_suite(tmp_path_factory.mktemp("suite"))


def new_run(conn: Redis, repo: str = "acme/gpu", pr: int = 7, **changes: Any) -> Run:
    run = runs.create_run(
        conn,
        repo=repo,
        installation_id=1,
        pr=pr,
        sha=SHA,
        batch="2",
        trigger=RunTrigger.PULL_REQUEST,
        requested_by="alice",
        config_text=CONFIG,
    )
    return runs.update_run(conn, run, **changes) if changes else run


def finished_run(conn: Redis, done: PytestRun, repo: str = "acme/gpu") -> tuple[Run, dict]:
    """A run as the GPU worker leaves it: its report sent and its JUnit uploaded, and the bot
    has applied them (result and JUnit stored, run completed)."""
    run = new_run(conn, repo, state=RunState.RUNNING, host="h20-01", gpus=(0,), check_run_id=42)
    run = runs.update_run(conn, run, started_at=run.created_at, lease_owner=f"{run.run_id}:x")
    outcome = RunOutcome(
        exit_code=1,
        timed_out=False,
        cancelled=False,
        setup_failed=False,
        preflight_error=None,
        junit_path=done.junit,
        report_path=done.report,
        log_path=done.junit.parent / "log.txt",
        log_tail=done.stdout,
        log_truncated=False,
        duration_s=1.5,
        workdir=done.junit.parent,
    )
    batch = load_config(CONFIG).batches["2"]
    gpus = open_backend("sim:8xH20-96GB").snapshot()[:1]
    result = conclude_run(Settings(host="h20-01"), batch, SHA, gpus, outcome)
    conn.set(keys.host_junit("h20-01", run.run_id), gzip.compress(done.junit.read_bytes()))
    report = result.report.to_json()
    message = HostMessage(Kind.FINISHED, run.run_id, run.lease_owner, result=report)
    assert hostlink.handle(conn, "h20-01", message.to_json()) == "finished"
    stored = load_result(conn, run.run_id)
    assert stored is not None
    done_run = runs.get_run(conn, run.run_id)
    assert done_run is not None
    return done_run, stored


def host_settings(name: str) -> Settings:
    return Settings(host=name, idle_samples=1, idle_sample_interval_s=0)


def publish(conn: Redis, name: str, spec: str) -> None:
    publish_host(conn, host_settings(name), open_backend(spec), slots=4)


def make_client(conn: Redis, redis_url: str, **settings: Any) -> Any:
    values = {"redis_url": redis_url, "webhook_secret": "s", **settings}
    return create_app(Settings(**values), conn).test_client()


@pytest.fixture
def client(redis_conn: Redis, redis_url: str) -> Any:
    return make_client(redis_conn, redis_url, public_repos="acme/gpu")


class Tables(HTMLParser):
    """Every table of a page as rows of cell texts, and the page's text."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.text: list[str] = []
        self._cell: list[str] | None = None
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def table(self, first_header: str) -> list[list[str]]:
        return next(t for t in self.tables if t and t[0] and t[0][0] == first_header)

    def page_text(self) -> str:
        return " ".join("".join(self.text).split())


# --- the run page shows what the Check Run says -----------------------------------------------


def test_run_page_shows_the_check_runs_title_counts_and_xpass(
    client: Any, redis_conn: Redis, pytest_run: PytestRun
) -> None:
    run, result = finished_run(redis_conn, pytest_run)
    response = client.get(f"/runs/{run.run_id}")
    assert response.status_code == 200
    page = Tables(response.get_data(as_text=True))
    text = page.page_text()
    output = result["check_output"]
    assert output["title"] in text
    assert "1 test marked xfail now passes: remove the marker" in output["title"]
    assert "1 test marked xfail now passes: remove the marker" in text
    counts = page.table("tests")
    names = ["tests", "passed", "failed", "errors", "skipped", "xfailed", "xpassed"]
    assert counts[0][: len(names)] == names
    assert counts[1][: len(names)] == [str(result[n]) for n in names]
    assert result["failed"] == 1 and result["xpassed"] == 1 and result["skipped"] == 1
    assert page.table("#")[1][1] == "NVIDIA H20"
    assert SHA in text and "needs 4 GPUs" in text


def test_run_page_links_the_check_run_context(
    redis_conn: Redis, redis_url: str, pytest_run: PytestRun
) -> None:
    client = make_client(redis_conn, redis_url, public_repos="acme/gpu")
    run, _ = finished_run(redis_conn, pytest_run)
    page = client.get(f"/runs/{run.run_id}").get_data(as_text=True)
    assert 'href="https://github.com/acme/gpu/pull/7"' in page
    assert f'href="https://github.com/acme/gpu/commit/{SHA}"' in page
    assert 'href="https://github.com/acme/gpu/runs/42"' in page
    assert f'href="/runs/{run.run_id}/junit.xml"' in page


def test_hostile_test_names_and_messages_render_as_text(
    client: Any, redis_conn: Redis, pytest_run: PytestRun
) -> None:
    run, result = finished_run(redis_conn, pytest_run)
    page = client.get(f"/runs/{run.run_id}").get_data(as_text=True)
    assert HOSTILE in result["log_tail"] and "<script>alert(2)" in result["check_output"]["text"]
    assert "<script" not in page and "<b>nan" not in page
    assert str(escape(HOSTILE)) in page  # in the log tail and the test tables, as text
    assert "&lt;/pre&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in page
    assert HOSTILE in Tables(page).page_text()


def test_running_run_shows_state_wait_reason_gpus_and_refreshes(
    client: Any, redis_conn: Redis
) -> None:
    publish(redis_conn, "h20-01", "sim:8xH20-96GB")
    run = new_run(redis_conn, state=RunState.ASSIGNED, host="h20-01", gpus=(2, 3))
    run = runs.update_run(redis_conn, run, wait_reason="starting on h20-01")
    page = client.get(f"/runs/{run.run_id}").get_data(as_text=True)
    assert "starting on h20-01" in page and 'http-equiv="refresh"' in page
    assert [row[0] for row in Tables(page).table("#")[1:]] == ["2", "3"]
    assert "No result yet" in page


def test_pending_run_shows_its_position(client: Any, redis_conn: Redis) -> None:
    first, second = new_run(redis_conn), new_run(redis_conn, pr=8)
    page = client.get(f"/runs/{second.run_id}").get_data(as_text=True)
    assert "position 2 in the queue" in page
    assert "position 1 in the queue" in client.get(f"/runs/{first.run_id}").get_data(True)


def test_unknown_run_is_a_404_page(client: Any) -> None:
    response = client.get("/runs/404")
    assert response.status_code == 404
    assert response.mimetype == "text/html"
    assert "No run 404" in response.get_data(as_text=True)


# --- JUnit download -----------------------------------------------------------------------------


def test_junit_download_is_the_stored_xml(
    client: Any, redis_conn: Redis, pytest_run: PytestRun
) -> None:
    run, _ = finished_run(redis_conn, pytest_run)
    response = client.get(f"/runs/{run.run_id}/junit.xml")
    assert response.status_code == 200
    assert response.data == pytest_run.junit.read_bytes()
    assert response.data == gzip.decompress(redis_conn.get(keys.junit(run.run_id)))
    assert response.headers["Content-Disposition"].startswith("attachment")
    assert "sandbox" in response.headers["Content-Security-Policy"]


@pytest.mark.parametrize("which", ["unknown run", "no junit"])
def test_missing_junit_is_a_json_404(client: Any, redis_conn: Redis, which: str) -> None:
    run_id = new_run(redis_conn).run_id if which == "no junit" else "999"
    response = client.get(f"/runs/{run_id}/junit.xml")
    assert response.status_code == 404
    assert response.is_json and run_id in response.get_json()["error"]


# --- the overview -------------------------------------------------------------------------------


def test_overview_shows_hosts_gpus_queue_and_recent_runs(
    client: Any, redis_conn: Redis, pytest_run: PytestRun, tmp_path: Path
) -> None:
    publish(redis_conn, "h20-01", "sim:8xH20-96GB")
    running = new_run(redis_conn, state=RunState.RUNNING, host="h20-01", gpus=(0, 1))
    leases.acquire(redis_conn, "h20-01", [0, 1], leases.new_owner(running.run_id), 30)
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps({"gpus": shared_gpus()}))
    publish(redis_conn, "shared-01", f"sim:{gpus}")
    publish(redis_conn, "gone-01", "sim:1xT4-16GB")
    redis_conn.delete(keys.host_alive("gone-01"))
    waiting = [new_run(redis_conn, pr=n, wait_reason=f"needs 8 GPUs ({n})") for n in (11, 12)]
    done, result = finished_run(redis_conn, pytest_run)

    page = Tables(client.get("/").get_data(as_text=True))
    h20, shared, gone = _host_tables(page)
    assert [row[3] for row in h20[1:]] == ["leased"] * 2 + ["idle"] * 6
    assert h20[1][4] == f"run #{running.run_id}"
    assert shared[1][3] == "busy"
    assert shared[1][4].startswith("foreign process pid 4242 (python, 30000 MiB); memory used")
    assert shared[2][3] == "unhealthy" and "NVML error: GPU is lost" in shared[2][4]
    assert gone[1][3:] == ["unhealthy", "host heartbeat lost"]
    text = page.page_text()
    assert "gone-01 lost" in text and "shared-01 alive" in text
    queue = page.table("position")
    assert [(r[0], r[1], r[6]) for r in queue[1:]] == [
        ("1", f"#{waiting[0].run_id}", "needs 8 GPUs (11)"),
        ("2", f"#{waiting[1].run_id}", "needs 8 GPUs (12)"),
    ]
    running_table, recent_table = (t for t in page.tables if t[0][0] == "run")
    assert running_table[1][:2] == [f"#{running.run_id}", "acme/gpu #7"]
    assert running_table[1][4:6] == ["h20-01", "0, 1"]
    recent = {row[0]: row for row in recent_table[1:]}
    assert recent[f"#{done.run_id}"][4:6] == ["failure", result["title"]]


def _host_tables(page: Tables) -> list[list[list[str]]]:
    """The GPU tables of the overview, in host name order: gone-01, h20-01, shared-01."""
    gone, h20, shared = [t for t in page.tables if t[0][0] == "GPU"]
    return [h20, shared, gone]


def shared_gpus() -> list[dict[str, Any]]:
    """A host where someone else uses GPU 0 and GPU 1 cannot be read."""
    h20 = {"name": "NVIDIA H20", "memory_gb": 96, "compute_capability": "9.0"}
    foreign = {"pid": 4242, "used_memory_mb": 30000, "name": "python"}
    return [
        {**h20, "memory_used_mb": 30000, "utilization_pct": 0, "processes": [foreign]},
        {**h20, "error": "GPU is lost"},
    ]


def test_overview_links_each_run_to_its_page(client: Any, redis_conn: Redis) -> None:
    run = new_run(redis_conn)
    page = client.get("/").get_data(as_text=True)
    assert f'href="/runs/{run.run_id}"' in page
    assert 'http-equiv="refresh" content="5"' in page


def test_overview_says_what_to_do_when_empty(client: Any) -> None:
    text = Tables(client.get("/").get_data(as_text=True)).page_text()
    assert "No GPU host has registered" in text and "gpuci worker" in text
    assert "not heartbeating" in text and "No runs yet" in text


def test_pages_forbid_scripts(client: Any) -> None:
    csp = client.get("/").headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp


# --- private by default ---------------------------------------------------------------------


def test_unlisted_repositories_are_private_without_a_token(
    redis_conn: Redis, redis_url: str, pytest_run: PytestRun
) -> None:
    client = make_client(redis_conn, redis_url)
    run, result = finished_run(redis_conn, pytest_run, repo="acme/secret")
    page = client.get(f"/runs/{run.run_id}").get_data(as_text=True)
    assert "are hidden" in page
    for shown in (result["title"], "needs 4 GPUs", "test_loss", "junit.xml"):
        assert shown not in page
    assert client.get(f"/runs/{run.run_id}/junit.xml").status_code == 403
    overview = client.get("/").get_data(as_text=True)
    assert result["title"] not in overview and "hidden" in overview


@pytest.mark.parametrize(
    ("repo", "public", "private", "token", "presented", "visible"),
    [
        ("acme/gpu", "", "", "", False, False),
        ("acme/gpu", "acme/gpu", "", "", False, True),
        ("Acme/GPU", "acme/*", "", "", False, True),
        ("acme/secret", "acme/*", "acme/secret", "", False, False),
        ("acme/secret", "acme/*", "acme/secret", "t", True, True),
        ("other/gpu", "acme/*", "", "t", False, False),
        ("other/gpu", "*", "", "", False, True),
    ],
)
def test_visibility_rule(
    repo: str, public: str, private: str, token: str, presented: bool, visible: bool
) -> None:
    settings = Settings(public_repos=public, private_repos=private, dashboard_token=token)
    assert results_visible(settings, repo, presented) is visible


# --- the access token -------------------------------------------------------------------------


@pytest.fixture
def locked(redis_conn: Redis, redis_url: str) -> Any:
    return make_client(redis_conn, redis_url, dashboard_token="tok-123")


@pytest.mark.parametrize("path", ["/", "/runs/1", "/runs/1/junit.xml", "/?token=wrong"])
def test_token_is_required(locked: Any, redis_conn: Redis, path: str) -> None:
    new_run(redis_conn)
    response = locked.get(path)
    assert response.status_code == 401
    assert "tok-123" not in response.get_data(as_text=True)


def test_token_in_the_url_becomes_a_cookie(locked: Any, redis_conn: Redis) -> None:
    run = new_run(redis_conn, repo="acme/secret")
    response = locked.get(f"/runs/{run.run_id}?token=tok-123&x=1")
    assert response.status_code == 303
    assert response.headers["Location"] == f"/runs/{run.run_id}?x=1"
    cookie = response.headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert "tok-123" not in cookie
    page = locked.get(f"/runs/{run.run_id}")  # the test client keeps the cookie
    assert page.status_code == 200 and "are hidden" not in page.get_data(as_text=True)


@pytest.mark.parametrize(
    "presented",
    [
        {"query_string": {"token": "t\u00f6k-\u2603"}},
        {"headers": {"Authorization": "Bearer t\u00f6k-\u00e9"}},
        {"headers": {"Cookie": f"{COOKIE}=\u00e9\u00e9"}},
    ],
    ids=["query", "bearer", "cookie"],
)
def test_a_non_ascii_token_is_refused_not_a_500(locked: Any, presented: dict[str, Any]) -> None:
    response = locked.get("/", **presented)
    assert response.status_code == 401
    assert "Token required" in response.get_data(as_text=True)


def test_cookie_is_secure_when_served_at_an_https_public_url(
    redis_conn: Redis, redis_url: str
) -> None:
    client = make_client(
        redis_conn, redis_url, dashboard_token="t", public_url="https://gpuci.example.org"
    )
    via_public = client.get("/?token=t", base_url="https://gpuci.example.org")
    assert "Secure" in via_public.headers["Set-Cookie"]
    via_tunnel = client.get("/?token=t", base_url="http://localhost:8000")
    assert "Secure" not in via_tunnel.headers["Set-Cookie"]


def test_bearer_token_opens_pages_and_private_results(
    locked: Any, redis_conn: Redis, pytest_run: PytestRun
) -> None:
    run, result = finished_run(redis_conn, pytest_run, repo="acme/secret")
    auth = {"Authorization": "Bearer tok-123"}
    page = locked.get(f"/runs/{run.run_id}", headers=auth).get_data(as_text=True)
    assert result["check_output"]["title"] in Tables(page).page_text()
    download = locked.get(f"/runs/{run.run_id}/junit.xml", headers=auth)
    assert download.data == pytest_run.junit.read_bytes()
    assert locked.get("/", headers={"Authorization": "Bearer nope"}).status_code == 401


@pytest.mark.parametrize("path", ["/healthz", "/metrics"])
def test_health_and_metrics_need_no_token(locked: Any, path: str) -> None:
    assert locked.get(path).status_code == 200


# --- pure pieces --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("markdown", "html"),
    [
        ("## gpuci / batch 2: ok", "<h3>gpuci / batch 2: ok</h3>"),
        ("**bold** and `code`", "<p><strong>bold</strong> and <code>code</code></p>"),
        ("a \\*literal\\* \\| pipe", "<p>a *literal* | pipe</p>"),
        ("&lt;script&gt; named", "<p>&lt;script&gt; named</p>"),
        ("<script>alert(1)</script>", "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>"),
        ("&amp;lt;b&amp;gt;", "<p>&amp;lt;b&amp;gt;</p>"),
        ("[x](javascript:alert(1))", "<p>[x](javascript:alert(1))</p>"),
        ("- one\n- <i>two</i>", "<ul><li>one</li><li>&lt;i&gt;two&lt;/i&gt;</li></ul>"),
        ("```text\n<b>x</b>\n```", "<pre><code>&lt;b&gt;x&lt;/b&gt;</code></pre>"),
        ("````\n```\n<x>\n````", "<pre><code>```\n&lt;x&gt;</code></pre>"),
        ("```\nnever closed <x>", "<pre><code>never closed &lt;x&gt;</code></pre>"),
        ("**unclosed <b>", "<p><strong>unclosed &lt;b&gt;</strong></p>"),
        (
            "| a | b \\| c |\n|--:|---|\n| 1 | <img src=x> |",
            '<table><thead><tr><th class="right">a</th><th>b | c</th></tr></thead>'
            '<tbody><tr><td class="right">1</td><td>&lt;img src=x&gt;</td></tr></tbody></table>',
        ),
        (
            "> [!WARNING]\n> **2 now pass**\n>\n> - t&lt;1&gt;",
            '<blockquote class="alert alert-warning"><p class="alert-title">Warning</p>'
            "<p><strong>2 now pass</strong></p>\n<ul><li>t&lt;1&gt;</li></ul></blockquote>",
        ),
    ],
)
def test_markdown_subset_escapes_everything(markdown: str, html: str) -> None:
    assert str(render_markdown(markdown)) == html


@pytest.mark.parametrize(
    "markdown",
    [
        "`" * 50_000,
        ">" * 50_000 + " deep",
        "# " + "a " * 50_000 + "#" * 10 + " " * 10 + "x",
        "a | b\n-" + " " * 50_000 + "x",
        "- " + "**" * 25_000,
    ],
    ids=["backticks", "nested-quotes", "long-heading", "divider-spaces", "bold-runs"],
)
def test_markdown_is_fast_on_hostile_input(markdown: str) -> None:
    started = time.monotonic()
    html = str(render_markdown(markdown))
    assert time.monotonic() - started < 1.0
    assert "<script" not in html and html


@pytest.mark.parametrize(
    ("entry", "holder", "alive", "status"),
    [
        ({"idle": True, "reasons": []}, None, True, GpuStatus.IDLE),
        ({"idle": True, "reasons": []}, "7:abc", True, GpuStatus.LEASED),
        ({"idle": False, "reasons": ["foreign process pid 1 (1 MiB)"]}, None, True, "busy"),
        ({"idle": False, "reasons": ["utilization 40%"]}, None, True, GpuStatus.BUSY),
        ({"idle": False, "reasons": ["NVML error: lost"]}, None, True, GpuStatus.UNHEALTHY),
        ({"idle": False, "reasons": ["memory used unknown"]}, None, True, "unhealthy"),
        ({"idle": True, "reasons": []}, None, False, GpuStatus.UNHEALTHY),
        ({"idle": None}, None, True, GpuStatus.BUSY),
    ],
)
def test_gpu_status(entry: dict[str, Any], holder: str | None, alive: bool, status: str) -> None:
    view = gpu_view({"index": 0, "name": "NVIDIA H20", **entry}, holder, alive)
    assert view.status == status
    assert view.run_id == ("7" if holder else "")


@pytest.mark.parametrize(
    ("api", "web"),
    [
        ("https://api.github.com", "https://github.com"),
        ("https://ghe.example.org/api/v3/", "https://ghe.example.org"),
        ("http://127.0.0.1:9000", ""),
    ],
)
def test_github_web_url(api: str, web: str) -> None:
    assert github_web_url(api) == web


def test_overview_shows_each_hosts_runtimes_and_a_full_disk(client: Any, redis_conn: Redis) -> None:
    settings = replace(host_settings("full-01"), min_free_disk="1000000TiB")
    publish_host(redis_conn, settings, open_backend("sim:1xH20-96GB"), 4, ["base:default", "image"])

    text = Tables(client.get("/").get_data(as_text=True)).page_text()

    assert "runtimes base:default, image" in text
    assert "Takes no new runs: only " in text and "below GPUCI_MIN_FREE_DISK" in text
