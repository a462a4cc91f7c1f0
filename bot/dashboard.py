"""The dashboard: hosts and their GPUs, the queue, recent runs, and each run's Check Run."""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import hmac
import html
import io
import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlencode, urlsplit

from flask import (
    Blueprint,
    Response,
    abort,
    current_app,
    g,
    redirect,
    render_template,
    request,
    url_for,
)
from flask.typing import ResponseReturnValue
from markupsafe import Markup, escape
from redis import Redis

from bot import charts, history, runs
from bot.leader import leader_view
from bot.runs import Run, RunState, load_result
from contract import keys, leases
from contract.settings import Settings

blueprint = Blueprint("dashboard", __name__, template_folder="templates")

REFRESH_S = 5
RECENT_RUNS = 50
PENDING_SHOWN = 100
COOKIE = "gpuci_dashboard"
COOKIE_MAX_AGE_S = 30 * 24 * 3600
JUNIT_CHUNK = 64 * 1024
# Pages render nothing active: no scripts at all, styles only from the page itself.
PAGE_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


# --- what each GPU is doing (pure) -----------------------------------------------------------


class GpuStatus(StrEnum):
    IDLE = "idle"
    LEASED = "leased"  # a gpuci run holds its lease
    BUSY = "busy"  # in use outside gpuci: foreign process, memory, utilization
    UNHEALTHY = "unhealthy"  # unreadable (NVML error, unknown values) or its host is lost


# Reasons (workers.gpus) that say the GPU cannot be read, not that someone uses it.
_UNHEALTHY_REASON = re.compile(r"NVML error|unknown|missing from|bad simulated")


@dataclass(frozen=True)
class GpuView:
    index: int
    name: str
    memory_gb: int | None
    status: GpuStatus
    run_id: str = ""  # the run holding the lease
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostView:
    name: str
    alive: bool
    heartbeat_age_s: float | None
    backend: str
    gpus: list[GpuView] = field(default_factory=list)
    runtimes: tuple[str, ...] = ()  # what it provides: `base:NAME`, `image`
    refusing: str = ""  # why it takes no new runs (its disk), or ""

    def count(self, status: GpuStatus) -> int:
        return sum(1 for gpu in self.gpus if gpu.status is status)


def gpu_view(entry: Mapping[str, Any], holder: str | None, host_alive: bool) -> GpuView:
    """A GPU's status from its host record entry and its lease: a lease wins, then a lost host,
    then the worker's own verdict (unreadable = unhealthy, otherwise in use = busy)."""
    reasons = tuple(str(r) for r in entry.get("reasons") or ())
    if holder is not None:
        status, run_id = GpuStatus.LEASED, leases.run_of(holder)
        return _gpu(entry, status, run_id, ())
    if not host_alive:
        return _gpu(entry, GpuStatus.UNHEALTHY, "", ("host heartbeat lost", *reasons))
    if any(_UNHEALTHY_REASON.search(r) for r in reasons):
        return _gpu(entry, GpuStatus.UNHEALTHY, "", reasons)
    if entry.get("idle") is not True:
        return _gpu(entry, GpuStatus.BUSY, "", reasons or ("not idle",))
    return _gpu(entry, GpuStatus.IDLE, "", ())


def _gpu(entry: Mapping[str, Any], status: GpuStatus, run_id: str, reasons: Any) -> GpuView:
    memory = entry.get("memory_gb")
    return GpuView(
        index=int(entry.get("index", 0)),
        name=str(entry.get("name") or "?"),
        memory_gb=memory if isinstance(memory, int) else None,
        status=status,
        run_id=run_id,
        reasons=tuple(reasons),
    )


# --- reading Redis -----------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _age(now: float, stamp: Any) -> float | None:
    try:
        return max(0.0, now - float(_text(stamp)))
    except (TypeError, ValueError):
        return None


def read_hosts(conn: Redis, now: float) -> list[HostView]:
    """Every registered GPU host with its GPUs' statuses, by name."""
    names = sorted(_text(n) for n in conn.smembers(keys.hosts()))
    return [read_host(conn, name, now) for name in names]


def read_host(conn: Redis, name: str, now: float) -> HostView:
    record = {_text(k): _text(v) for k, v in conn.hgetall(keys.host(name)).items()}
    alive = bool(conn.exists(keys.host_alive(name)))
    try:
        entries = [e for e in json.loads(record.get("gpus") or "[]") if isinstance(e, dict)]
    except ValueError:
        entries = []
    held = leases.holders(conn, name, [int(e.get("index", 0)) for e in entries])
    gpus = [gpu_view(e, held.get(int(e.get("index", 0))), alive) for e in entries]
    age = _age(now, record.get("heartbeat_at"))
    try:
        runtimes = tuple(str(r) for r in json.loads(record.get("runtimes") or "[]"))
    except ValueError:
        runtimes = ()
    backend = record.get("backend", "")
    return HostView(name, alive, age, backend, gpus, runtimes, record.get("refusing", ""))


def scheduler_heartbeat(conn: Redis, now: float) -> tuple[bool, float | None]:
    """(alive, seconds since its last round): alive while keys.scheduler_alive() exists."""
    stamp = conn.get(keys.scheduler_alive())
    return stamp is not None, _age(now, stamp) if stamp is not None else None


# --- who may see what (pure) -------------------------------------------------------------------


def repo_listed(repo: str, patterns: str) -> bool:
    """`repo` matches one of the comma-separated fnmatch patterns (case-insensitive)."""
    wanted = [p.strip().lower() for p in patterns.split(",") if p.strip()]
    return any(fnmatch.fnmatchcase(repo.lower(), p) for p in wanted)


def results_visible(settings: Settings, repo: str, token_presented: bool) -> bool:
    """A run's results (title, summary, log tail, JUnit XML) are shown with the dashboard token
    configured and presented, or for a repository listed public and not listed private.
    gpuci does not know a repository's visibility, so any other repository counts as private."""
    if settings.dashboard_token and token_presented:
        return True
    return repo_listed(repo, settings.public_repos) and not repo_listed(
        repo, settings.private_repos
    )


def cookie_value(token: str) -> str:
    """What the session cookie holds: derived from the token, never the token itself."""
    return hmac.new(token.encode(), b"gpuci dashboard session", hashlib.sha256).hexdigest()


def presented_token(settings: Settings, authorization: str, cookie: str, query: str) -> str:
    """How the request proved it knows the token: "header", "cookie", "query", or ""."""
    token = settings.dashboard_token
    if not token:
        return ""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and _same(value.strip(), token):
        return "header"
    if cookie and _same(cookie, cookie_value(token)):
        return "cookie"
    if query and _same(query, token):
        return "query"
    return ""


def _same(given: str, secret: str) -> bool:
    """Constant-time comparison of what a client sent, as bytes: any text is an answer."""
    return hmac.compare_digest(given.encode("utf-8", "replace"), secret.encode())


# --- links to GitHub (pure) --------------------------------------------------------------------


def github_web_url(api_url: str) -> str:
    """The web UI of a REST base URL: api.github.com -> github.com, GHES /api/v3 -> its host;
    "" when unknown (fakehub), so no link is made."""
    base = api_url.rstrip("/")
    if base == "https://api.github.com":
        return "https://github.com"
    return base.removesuffix("/api/v3") if base.endswith("/api/v3") else ""


@dataclass(frozen=True)
class RunLinks:
    repo: str = ""
    pr: str = ""
    commit: str = ""
    check_run: str = ""


def run_links(web: str, run: Run) -> RunLinks:
    if not web:
        return RunLinks()
    repo = f"{web}/{run.repo}"
    return RunLinks(
        repo=repo,
        pr=f"{repo}/pull/{run.pr}" if run.pr else "",
        commit=f"{repo}/commit/{run.sha}",
        check_run=f"{repo}/runs/{run.check_run_id}" if run.check_run_id else "",
    )


# --- Check Run markdown as HTML (pure) ---------------------------------------------------------
# The subset gpuci's own Check Run output uses (workers/checks.py): headings, tables, lists,
# block quotes (GitHub alerts), fenced code, paragraphs, bold and inline code. Every piece of
# text is escaped as it is written out, so no HTML from the markdown (or a test) reaches the page.

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|(\d+)[.)])\s+(.*)$")
_ALERT = re.compile(r"^\[!(NOTE|TIP|IMPORTANT|WARNING|CAUTION)\]\s*$", re.IGNORECASE)
_INLINE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|~>])|\*\*|`([^`]+)`")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_QUOTE_MARKS = re.compile(r"^(?:\s*>)+ ?")
BlockParser = Callable[[list[str], int], tuple[str, int]]


def render_markdown(text: str) -> Markup:
    """HTML for Check Run markdown; text is always escaped, never passed through."""
    lines = text.replace("\r\n", "\n").split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        chunk, i = _block_parser(lines, i)(lines, i)
        out.append(chunk)
    return Markup("\n".join(out))


def _block_parser(lines: list[str], i: int) -> BlockParser:
    line = lines[i]
    if _FENCE.match(line):
        return _code_block
    if _HEADING.match(line):
        return _heading
    if line.lstrip().startswith(">"):
        return _quote
    if _is_table(lines, i):
        return _table
    if _LIST_ITEM.match(line):
        return _list
    return _paragraph


def _code_block(lines: list[str], i: int) -> tuple[str, int]:
    match = _FENCE.match(lines[i])
    assert match is not None
    fence = match.group(1)
    closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
    body: list[str] = []
    i += 1
    while i < len(lines) and not closing.match(lines[i]):
        body.append(lines[i])
        i += 1
    return f"<pre><code>{escape(chr(10).join(body))}</code></pre>", i + 1


def _heading(lines: list[str], i: int) -> tuple[str, int]:
    match = _HEADING.match(lines[i])
    assert match is not None
    level = min(6, len(match.group(1)) + 1)  # the page's own title is the h1
    return f"<h{level}>{render_inline(match.group(2).strip())}</h{level}>", i + 1


def _quote(lines: list[str], i: int) -> tuple[str, int]:
    inner: list[str] = []
    while i < len(lines) and lines[i].lstrip().startswith(">"):
        inner.append(_QUOTE_MARKS.sub("", lines[i]))  # nested quotes flatten: no deep recursion
        i += 1
    alert = _ALERT.match(inner[0]) if inner else None
    if alert:
        kind = alert.group(1).lower()
        body = render_markdown("\n".join(inner[1:]))
        label = f'<p class="alert-title">{escape(kind.title())}</p>'
        return f'<blockquote class="alert alert-{kind}">{label}{body}</blockquote>', i
    return f"<blockquote>{render_markdown(chr(10).join(inner))}</blockquote>", i


def _is_table(lines: list[str], i: int) -> bool:
    divider = lines[i + 1].strip() if i + 1 < len(lines) else ""
    return "|" in lines[i] and "-" in divider and set(divider) <= set("|:- ")


def _cells(line: str) -> list[str]:
    row = line.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") and not row.endswith("\\|") else row
    return [cell.strip() for cell in _CELL_SPLIT.split(row)]


def _table(lines: list[str], i: int) -> tuple[str, int]:
    aligns = ["right" if c.endswith(":") else "" for c in _cells(lines[i + 1])]
    head = _row(_cells(lines[i]), aligns, "th")
    rows: list[str] = []
    i += 2
    while i < len(lines) and lines[i].strip().startswith("|"):
        rows.append(_row(_cells(lines[i]), aligns, "td"))
        i += 1
    return f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>", i


def _row(cells: Sequence[str], aligns: Sequence[str], tag: str) -> str:
    out = []
    for n, cell in enumerate(cells):
        align = aligns[n] if n < len(aligns) else ""
        attr = f' class="{align}"' if align else ""
        out.append(f"<{tag}{attr}>{render_inline(cell)}</{tag}>")
    return f"<tr>{''.join(out)}</tr>"


def _list(lines: list[str], i: int) -> tuple[str, int]:
    first = _LIST_ITEM.match(lines[i])
    tag = "ol" if first and first.group(1) else "ul"
    items: list[str] = []
    while i < len(lines) and (item := _LIST_ITEM.match(lines[i])):
        items.append(f"<li>{render_inline(item.group(2))}</li>")
        i += 1
    return f"<{tag}>{''.join(items)}</{tag}>", i


def _paragraph(lines: list[str], i: int) -> tuple[str, int]:
    body: list[str] = []
    while i < len(lines) and lines[i].strip():
        if body and _block_parser(lines, i) is not _paragraph:
            break
        body.append(lines[i].strip())
        i += 1
    return f"<p>{render_inline(chr(10).join(body))}</p>", i


def render_inline(text: str) -> Markup:
    """Backslash escapes, **bold** and `code`; entities are decoded, then all text escaped."""
    out: list[str] = []
    bold = False
    position = 0
    for match in _INLINE.finditer(text):
        out.append(_literal(text[position : match.start()]))
        if match.group(1) is not None:
            out.append(str(escape(match.group(1))))
        elif match.group(0) == "**":
            out.append("</strong>" if bold else "<strong>")
            bold = not bold
        else:
            out.append(f"<code>{escape(match.group(2))}</code>")
        position = match.end()
    out.append(_literal(text[position:]))
    if bold:
        out.append("</strong>")
    return Markup("".join(out))


def _literal(text: str) -> str:
    return str(escape(html.unescape(text)))


# --- the views ---------------------------------------------------------------------------------


def _settings() -> Settings:
    value: Settings = current_app.config["GPUCI_SETTINGS"]
    return value


def _redis() -> Redis:
    conn: Redis = current_app.extensions["gpuci_redis"]
    return conn


@blueprint.before_request
def require_token() -> ResponseReturnValue | None:
    """With GPUCI_DASHBOARD_TOKEN set, every dashboard request must present it."""
    settings = _settings()
    how = presented_token(
        settings,
        request.headers.get("Authorization", ""),
        request.cookies.get(COOKIE, ""),
        request.args.get("token", ""),
    )
    g.gpuci_token_presented = bool(how)
    if how == "query":
        return _login_redirect(settings)
    if settings.dashboard_token and not how:
        if request.endpoint == "dashboard.junit_download":
            abort(401, "this dashboard needs its token: ?token=... or Authorization: Bearer")
        return _page("message.html", 401, heading="Token required", login=True)
    return None


def _login_redirect(settings: Settings) -> ResponseReturnValue:
    """The token was in the URL: keep it in a cookie and drop it from the address bar."""
    rest = [(k, v) for k, v in request.args.items(multi=True) if k != "token"]
    response = redirect(request.path + (f"?{urlencode(rest)}" if rest else ""), 303)
    public = urlsplit(settings.public_url)
    secure = request.is_secure or (public.scheme == "https" and public.netloc == request.host)
    response.set_cookie(
        COOKIE,
        cookie_value(settings.dashboard_token),
        max_age=COOKIE_MAX_AGE_S,
        httponly=True,
        secure=secure,
        samesite="Lax",  # Lax: the details_url link from GitHub must carry it
    )
    return response


@blueprint.after_request
def protect_page(response: Response) -> Response:
    response.headers.setdefault("Content-Security-Policy", PAGE_CSP)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Cache-Control"] = "no-store"
    return response


@blueprint.app_template_filter("seconds")
def format_seconds(value: float) -> str:
    """A duration or an age: "42 s", "3m 05s", "2h 07m"."""
    seconds = max(0, round(value))
    if seconds < 90:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 90:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


@blueprint.app_template_filter("clock")
def format_clock(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp))


def _page(template: str, status: int = 200, **context: Any) -> Response:
    body = render_template(template, refresh_s=REFRESH_S, now=time.time(), **context)
    return Response(body, status=status, mimetype="text/html")


def _visible(run: Run) -> bool:
    return results_visible(_settings(), run.repo, bool(g.get("gpuci_token_presented")))


@blueprint.get("/")
def overview() -> ResponseReturnValue:
    conn, now = _redis(), time.time()
    alive, age = scheduler_heartbeat(conn, now)
    return _page(
        "overview.html",
        hosts=read_hosts(conn, now),
        pending=runs.pending_runs(conn, limit=PENDING_SHOWN),
        waiting_total=conn.zcard(keys.pending_runs()),
        running=sorted(runs.dispatched_runs(conn), key=lambda r: r.created_at),
        recent=runs.list_runs(conn, limit=RECENT_RUNS),
        scheduler_alive=alive,
        scheduler_age=age,
        leader=leader_view(conn, now),
        statuses=list(GpuStatus),
        visible=_visible,
        token_configured=bool(_settings().dashboard_token),
    )


@blueprint.get("/runs/<run_id>")
def run_page(run_id: str) -> ResponseReturnValue:
    conn = _redis()
    run = runs.get_run(conn, run_id)
    if run is None:
        return _page("message.html", 404, heading=f"No run {run_id}", login=False)
    visible = _visible(run)
    result = load_result(conn, run_id) if visible else None
    position = _queue_position(conn, run)
    return _page(
        "run.html",
        run=run,
        result=result,
        output=(result or {}).get("check_output") or {},
        visible=visible,
        has_junit=visible and bool(conn.exists(keys.junit(run_id))),
        position=position,
        gpus=_run_gpus(conn, run, result),
        links=run_links(github_web_url(_settings().github_api_url), run),
        markdown=render_markdown,
        **_run_history(conn, run, result),
    )


def _queue_position(conn: Redis, run: Run) -> int | None:
    """1 for the next pending run to be considered; None when the run is not pending."""
    if run.state is not RunState.PENDING:
        return None
    rank: Any = conn.zrank(keys.pending_runs(), run.run_id)
    return None if rank is None else int(rank) + 1


def _run_gpus(conn: Redis, run: Run, result: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The GPUs the run used (from its result), else those it holds (from its host's record)."""
    if result and result.get("gpus"):
        return [g for g in result["gpus"] if isinstance(g, dict)]
    if not run.host or not run.gpus:
        return []
    raw = conn.hget(keys.host(run.host), "gpus")
    entries = json.loads(raw) if raw else []
    return [e for e in entries if isinstance(e, dict) and e.get("index") in run.gpus]


@blueprint.get("/runs/<run_id>/junit.xml")
def junit_download(run_id: str) -> ResponseReturnValue:
    conn = _redis()
    run = runs.get_run(conn, run_id)
    if run is None:
        abort(404, f"no run {run_id}")
    if not _visible(run):
        abort(403, "this repository's results are private: set GPUCI_DASHBOARD_TOKEN and use it")
    packed: Any = conn.get(keys.junit(run_id))
    if packed is None:
        abort(404, f"run {run_id} has no JUnit XML (not finished, none written, or expired)")
    response = Response(_gunzip(packed), mimetype="application/xml")
    response.headers["Content-Disposition"] = f'attachment; filename="gpuci-run-{run_id}.xml"'
    response.headers["Content-Security-Policy"] = "default-src 'none'; sandbox"
    return response


def _gunzip(packed: bytes) -> Iterator[bytes]:
    """The XML in chunks, so a file that inflates hugely never sits in memory whole."""
    with gzip.GzipFile(fileobj=io.BytesIO(packed)) as stream:
        while chunk := stream.read(JUNIT_CHUNK):
            yield chunk


# --- test history pages -------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")


@dataclass(frozen=True)
class TestLink:
    """A test the run page names, linked to its history page."""

    test_id: str
    href: str
    here: str  # what it did in this run
    why: str = ""  # its class against the default branch, and why
    seconds: float | None = None
    median_s: float | None = None


def run_tests(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every test the run's result names (failures, XPASSes, skips and flaky passes against
    the default branch, the slowest), once each, failures first (pure)."""
    found: dict[str, dict[str, Any]] = {}
    past = result.get("history") or {}
    classes = {f["test_id"]: f"{f['class']}: {f['why']}" for f in past.get("failures", [])}
    for failure in result.get("failures", []):
        tid = failure["test_id"]
        found.setdefault(tid, {"here": failure["kind"], "why": classes.get(tid, "")})
    for tid in result.get("xpassed_tests", []):
        found.setdefault(tid, {"here": "xpassed", "why": ""})
    for entry in past.get("stale_xfails", []):
        stale = found.setdefault(entry["test_id"], {"here": "xpassed"})
        stale["why"] = f"XPASS in the last {entry['runs']} runs there: remove the xfail marker"
    for entry in past.get("newly_skipped", []):
        why = "passed there"
        found.setdefault(entry["test_id"], {"here": f"skipped: {entry['reason']}", "why": why})
    for tid in past.get("rerun_passes", []):
        found.setdefault(tid, {"here": "passed on a rerun", "why": "flaky"})
    for tid, seconds, median in past.get("slowest", []):
        entry = found.setdefault(tid, {"here": "slow", "why": ""})
        entry.update(seconds=seconds, median_s=median)
    return [{"test_id": tid, **entry} for tid, entry in found.items()]


def _run_history(conn: Redis, run: Run, result: dict[str, Any] | None) -> dict[str, Any]:
    """The run page's links to its tests' histories and its batch's duration trend."""
    if not result:
        return {"test_links": [], "trend_svg": ""}
    owner, _, name = run.repo.partition("/")
    links = [
        TestLink(
            test_id=t["test_id"],
            href=_test_url(owner, name, run.batch, t["test_id"]),
            here=t["here"],
            why=t["why"],
            seconds=t.get("seconds"),
            median_s=t.get("median_s"),
        )
        for t in run_tests(result)
    ]
    trend = list(reversed(history.trend(conn, run.repo, run.batch)))
    points = [(f"run {r['run']} at {str(r['sha'])[:12]}", float(r["duration"])) for r in trend]
    return {"test_links": links, "trend_svg": charts.duration_plot(points)}


def _test_url(owner: str, name: str, batch: str, test_id: str) -> str:
    return url_for("dashboard.history_test", owner=owner, name=name, batch=batch, test_id=test_id)


def _history_repo(owner: str, name: str, batch: str) -> str | Response:
    """The repository, or the page saying why its history is not shown."""
    if not all(_NAME.fullmatch(part) for part in (owner, name, batch)):
        return _page("message.html", 404, heading="No such repository or batch", login=False)
    repo = f"{owner}/{name}"
    if not results_visible(_settings(), repo, bool(g.get("gpuci_token_presented"))):
        return _page("message.html", 403, heading=f"The history of {repo} is private", login=False)
    return repo


@blueprint.get("/history/<owner>/<name>/<batch>")
def history_batch(owner: str, name: str, batch: str) -> ResponseReturnValue:
    repo = _history_repo(owner, name, batch)
    if isinstance(repo, Response):
        return repo
    found = history.batch_summary(_redis(), repo, batch)
    points = [
        (f"run {r['run']} at {str(r['sha'])[:12]}", float(r["duration"])) for r in found["runs"]
    ]
    failing = [{**f, "href": _test_url(owner, name, batch, f["test_id"])} for f in found["failing"]]
    return _page(
        "history_batch.html",
        summary=found,
        failing=failing,
        plot=charts.duration_plot(points),
    )


@blueprint.get("/history/<owner>/<name>/<batch>/tests/<path:test_id>")
def history_test(owner: str, name: str, batch: str, test_id: str) -> ResponseReturnValue:
    repo = _history_repo(owner, name, batch)
    if isinstance(repo, Response):
        return repo
    found = history.test_summary(_redis(), repo, batch, test_id)
    cells = [
        charts.Cell(r["outcome"], f"run {r['run']} at {str(r['sha'])[:12]}") for r in found["runs"]
    ]
    return _page(
        "history_test.html",
        summary=found,
        strip=charts.outcome_strip(cells),
        words={k: word for k, (_, word) in charts.OUTCOME_STYLE.items()},
        batch_href=url_for("dashboard.history_batch", owner=owner, name=name, batch=batch),
    )
