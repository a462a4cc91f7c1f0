"""Report jobs (events worker): bring a run's Check Run up to date with the run's state."""

from __future__ import annotations

import logging
from typing import Any

from bot import runs
from bot.events import batch_check_name, context
from bot.github_app import RepoClient
from bot.reporting import REPORTS_QUEUE
from bot.runs import Run, RunState, load_result
from bot.timestamps import iso
from contract.checks import annotation_chunks

log = logging.getLogger("gpuci.reports")

QUEUE = REPORTS_QUEUE
SUMMARY_LIMIT = 65535


def _gpus(run: Run) -> str:
    return ", ".join(str(i) for i in run.gpus) or "none (CPU batch)"


def check_updates(
    run: Run, result: dict[str, Any] | None, details_url: str
) -> list[dict[str, Any]]:
    """The PATCH bodies that make the Check Run show the run: the state first, then further
    annotations in chunks of 50 (GitHub appends annotations across updates). A run of
    approved code says who approved it, how and when, first in every summary."""
    updates = _state_updates(run, result, details_url)
    if run.approval_text:
        for body in updates:
            output = body["output"]
            output["summary"] = f"{run.approval_text}.\n\n{output['summary']}"[:SUMMARY_LIMIT]
    return updates


def _state_updates(
    run: Run, result: dict[str, Any] | None, details_url: str
) -> list[dict[str, Any]]:
    base: dict[str, Any] = {"details_url": details_url}
    if run.state is RunState.PENDING:
        return [
            {
                **base,
                "status": "queued",
                "output": _output("Waiting for a GPU host", run.wait_reason),
            }
        ]
    if run.state is RunState.ASSIGNED:
        return [
            {
                **base,
                "status": "queued",
                "output": _output(f"Starting on {run.host}", f"GPUs {_gpus(run)} leased."),
            }
        ]
    if run.state is RunState.RUNNING:
        started = iso(run.started_at) if run.started_at else None
        body = {
            **base,
            "status": "in_progress",
            "output": _output(
                f"Running on {run.host}",
                f"Batch `{run.batch}` at `{run.sha[:12]}` on GPUs {_gpus(run)} of `{run.host}`.",
            ),
        }
        return [{**body, "started_at": started} if started else body]
    if run.state in (RunState.COMPLETED, RunState.CANCELLED):
        return _completed(run, result, base)
    return []


def _completed(
    run: Run, result: dict[str, Any] | None, base: dict[str, Any]
) -> list[dict[str, Any]]:
    cancelled = run.state is RunState.CANCELLED
    conclusion = "cancelled" if cancelled else (run.conclusion or "failure")
    body: dict[str, Any] = {**base, "status": "completed", "conclusion": conclusion}
    if run.finished_at:
        body["completed_at"] = iso(run.finished_at)
    if result is None:
        title = "Cancelled" if cancelled else (run.title or "Failed before the batch ran")
        summary = run.wait_reason if cancelled else (run.title or "")
        return [{**body, "output": _output(title, summary or title)}]
    output = result["check_output"]
    title = f"Cancelled: {run.wait_reason}" if cancelled and run.wait_reason else output["title"]
    chunks = annotation_chunks(output.get("annotations") or [])
    first = {
        **body,
        "output": {
            **_output(title, output["summary"], output.get("text")),
            "annotations": chunks[0] if chunks else [],
        },
    }
    rest = [{"output": {**_output(title, output["summary"]), "annotations": c}} for c in chunks[1:]]
    return [first, *rest]


def _output(title: str, summary: str, text: str | None = None) -> dict[str, Any]:
    out = {"title": title[:1000], "summary": summary[:SUMMARY_LIMIT] or title[:1000]}
    if text:
        out["text"] = text[:SUMMARY_LIMIT]
    return out


def report_run(run_id: str) -> str:
    """The RQ job: render the run's current state onto its Check Run (creating it if none)."""
    ctx = context()
    run = runs.get_run(ctx.redis, run_id)
    if run is None:
        return f"run {run_id}: unknown"
    details = f"{ctx.settings.public_url.rstrip('/')}/runs/{run.run_id}"
    updates = check_updates(run, load_result(ctx.redis, run_id), details)
    if not updates:
        return f"run {run_id}: nothing to report ({run.state})"
    final = updates[0].get("status") == "completed"
    sent = runs.final_updates_sent(ctx.redis, run_id) if final else 0
    # a cancelled run's Check Run was completed when it was cancelled: its host's last report
    # (the run stopped) changes only what the run page shows
    if sent >= len(updates) or (sent and run.state is RunState.CANCELLED):
        return f"run {run_id}: already reported as completed"
    gh = ctx.github.repo(run.installation_id, run.repo)
    check_id = run.check_run_id or _create_check(ctx.redis, gh, run)
    for number, body in enumerate(updates[sent:], start=sent + 1):
        gh.update_check_run(check_id, body)
        if final:  # a retry after a failure sends only what GitHub has not got yet
            runs.record_final_updates(ctx.redis, run_id, number)
    log.info(
        "run=%s repo=%s sha=%s check_run=%s status=%s reported",
        run_id, run.repo, run.sha, check_id, updates[0].get("status"),
    )  # fmt: skip
    return f"run {run_id}: {updates[0].get('conclusion') or updates[0].get('status')}"


def _create_check(conn: Any, gh: RepoClient, run: Run) -> int:
    """A check run for a run that has none yet (scheduled runs), made once."""
    name = batch_check_name(run.batch)
    purpose = f"{run.run_id}:report"
    found = runs.recorded_check(conn, run.repo, run.sha, name, purpose)
    if isinstance(found, int):
        check_id = found
    else:
        existing = gh.find_check_run(run.sha, name, run.run_id) if found else None
        if existing is None:
            runs.record_check(conn, run.repo, run.sha, name, purpose, runs.ATTEMPT)
            existing = gh.create_check_run(
                {"name": name, "head_sha": run.sha, "external_id": run.run_id, "status": "queued"}
            )
        check_id = existing
        runs.record_check(conn, run.repo, run.sha, name, purpose, check_id)
    runs.update_run(conn, run, check_run_id=check_id)
    return check_id
