"""The dashboard in a real headless Chromium, driven over the DevTools protocol (a pipe)."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import itertools
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from app import create_app
from contract.settings import Settings
from tests.missing_tools import skip_missing
from tests.test_dashboard import PytestRun, finished_run, publish, run_suite

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
    "--window-size=1280,1000",
]
WAIT_S = 15.0


def find_browser() -> str | None:
    named = os.environ.get("GPUCI_CHROMIUM")
    if named:
        return shutil.which(named) or named
    return next((found for b in BROWSERS if (found := shutil.which(b))), None)


class Browser:
    """One Chromium page over `--remote-debugging-pipe`: commands go to its fd 3, replies and
    events come from its fd 4, each a JSON message ended by a NUL byte."""

    def __init__(self, executable: str, profile: Path) -> None:
        to_chrome_r, self._to_chrome = _pipe()
        self._from_chrome, from_chrome_w = _pipe()

        def remap() -> None:  # in the child: the pipe ends become its fds 3 and 4
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.process = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4, to_chrome_r, from_chrome_w),
            preexec_fn=remap,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._ids = itertools.count(1)
        self._replies: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        attached = self.call("Target.attachToTarget", targetId=target, flatten=True)
        self.session = attached["sessionId"]
        self.call("Page.enable", session=True)

    def _read(self) -> None:
        buffer = b""
        while chunk := os.read(self._from_chrome, 1 << 16):
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                with self._lock:
                    waiting = self._replies.get(message.get("id", -1))
                (waiting or self._events).put(message)

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        number = next(self._ids)
        reply: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            self._replies[number] = reply
        message: dict[str, Any] = {"id": number, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        try:
            answer = reply.get(timeout=WAIT_S)
        except queue.Empty:
            code = self.process.poll()
            state = "is still running" if code is None else f"exited with {code}"
            raise AssertionError(f"Chromium did not answer {method} ({state})") from None
        assert "error" not in answer, f"{method}: {answer['error']}"
        result: dict[str, Any] = answer["result"]
        return result

    def wait_for_load(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            event = self._events.get(timeout=max(0.01, deadline - time.monotonic()))
            if event.get("method") == "Page.loadEventFired":
                return
        raise AssertionError("the page did not finish loading")

    def open(self, url: str) -> None:
        self._drain()
        self.call("Page.navigate", session=True, url=url)
        self.wait_for_load()

    def click(self, selector: str) -> None:
        self._drain()
        clicked = self.js(f"(e => {{ if (e) e.click(); return !!e; }})({_q(selector)})")
        assert clicked, f"nothing to click: {selector}"
        self.wait_for_load()

    def js(self, expression: str) -> Any:
        found = self.call(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True
        )
        assert "exceptionDetails" not in found, found["exceptionDetails"]
        return found["result"].get("value")

    def text(self, selector: str) -> str:
        value = self.js(f"(e => e ? e.innerText : null)({_q(selector)})")
        assert value is not None, f"no element {selector} on {self.js('location.href')}"
        return " ".join(str(value).split())

    def screenshot(self, path: Path) -> None:
        shot = self.call("Page.captureScreenshot", session=True, format="png")
        path.write_bytes(base64.b64decode(shot["data"]))

    def _drain(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                self._events.get_nowait()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call("Browser.close")
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


def _pipe() -> tuple[int, int]:
    """A pipe whose fds are above 4, so that remapping them onto 3 and 4 cannot clobber one."""
    read, write = os.pipe()
    high = (fcntl.fcntl(read, fcntl.F_DUPFD, 10), fcntl.fcntl(write, fcntl.F_DUPFD, 10))
    os.close(read)
    os.close(write)
    return high


def _q(selector: str) -> str:
    return f"document.querySelector({json.dumps(selector)})"


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def browser() -> Iterator[Browser]:
    executable = find_browser()
    if executable is None:
        skip_missing(
            "Chromium is not installed: apt-get install -y chromium (or set GPUCI_CHROMIUM)"
        )
    profile = Path(tempfile.mkdtemp(prefix="gpuci-chromium-"))
    started = Browser(executable, profile)
    try:
        yield started
    finally:
        started.close()
        shutil.rmtree(profile, ignore_errors=True)


@contextlib.contextmanager
def screenshot_on_failure(browser: Browser, name: str) -> Iterator[None]:
    """A failing step leaves a screenshot of the page; the failure names its path."""
    try:
        yield
    except Exception as exc:
        shot = Path(tempfile.mkdtemp(prefix="gpuci-browser-")) / f"{name}.png"
        try:
            browser.screenshot(shot)
            where = f"screenshot of the page: {shot}"
        except Exception as shot_exc:
            where = f"no screenshot: {shot_exc}"
        raise AssertionError(f"{exc}\n{where}") from exc


@pytest.fixture(scope="module")
def pytest_run(tmp_path_factory: pytest.TempPathFactory) -> PytestRun:
    return run_suite(tmp_path_factory.mktemp("suite"))


def test_overview_to_run_page_shows_the_check_runs_title_and_counts(
    browser: Browser, redis_conn: Redis, redis_url: str, pytest_run: PytestRun
) -> None:
    publish(redis_conn, "h20-01", "sim:8xH20-96GB")
    run, result = finished_run(redis_conn, pytest_run)
    settings = Settings(redis_url=redis_url, webhook_secret="s", public_repos="acme/gpu")
    app = create_app(settings, redis_conn)
    with serve(app) as url, screenshot_on_failure(browser, "overview-to-run"):
        browser.open(url + "/")
        assert "h20-01" in browser.text("#hosts + section h3")
        assert result["title"] in browser.text("main")
        browser.click(f'a[href="/runs/{run.run_id}"]')
        assert browser.js("location.pathname") == f"/runs/{run.run_id}"
        output = result["check_output"]
        assert browser.text("#title") == output["title"]
        cells = browser.js(
            "[...document.querySelectorAll('#summary table')[0].rows]"
            ".map(r => [...r.cells].map(c => c.innerText.trim()))"
        )
        names = ["tests", "passed", "failed", "errors", "skipped", "xfailed", "xpassed"]
        assert cells[0][: len(names)] == names
        assert cells[1][: len(names)] == [str(result[n]) for n in names]
        assert "1 test marked xfail now passes" in browser.text("#summary")
        log_tail = browser.js("document.querySelector('#log-tail').textContent")
        assert "<script>alert(1)</script>" in log_tail
        assert browser.js("document.scripts.length") == 0
