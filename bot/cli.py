"""The `gpuci` command line: one subcommand per process or tool of the design's CLI table."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.settings import Settings, SettingsError

if TYPE_CHECKING:
    from bot.github_app import GitHubApp

Handler = Callable[[argparse.Namespace, Settings], int]
EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return EXIT_UNUSABLE
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"gpuci: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    handler: Handler = args.handler
    try:
        return handler(args, settings)
    except KeyboardInterrupt:
        print("gpuci: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`gpuci summarize ... | head -1`): no traceback, and the exit
        # status a command killed by SIGPIPE has, as `yes | head` gives. stdout is pointed at
        # /dev/null so that the interpreter's last flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuci", description="Run a repository's GPU test batches and report them."
    )
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    web = sub.add_parser(
        "web",
        help="serve webhooks, the dashboard, /healthz and /metrics (the Procfile's server)",
    )
    web.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    web.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    web.add_argument("--workers", type=int, default=1, help="processes (default 1; Procfile: 2)")
    web.set_defaults(handler=cmd_web)

    events = sub.add_parser("events", help="the events worker: webhook deliveries -> Check Runs")
    events.set_defaults(handler=cmd_events)

    runs = sub.add_parser("runs", help="list the runs in Redis, newest first")
    runs.add_argument("--json", action="store_true", help="print a JSON list of runs")
    runs.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    runs.set_defaults(handler=cmd_runs)

    past = sub.add_parser("history", help="a batch's or a test's history on the default branch")
    past.add_argument("repo", help="the repository, owner/name")
    past.add_argument("batch", help="the batch's name")
    past.add_argument("test", nargs="?", help="a test's id (tests/x.py::test_y): its outcomes")
    past.add_argument("--json", action="store_true", help="print JSON")
    past.set_defaults(handler=cmd_history)

    config = sub.add_parser("config", help="work with .gpuci.yml")
    config_sub = config.add_subparsers(title="config commands", metavar="SUBCOMMAND")
    check = config_sub.add_parser("check", help="validate a .gpuci.yml; exit 1 with every error")
    check.add_argument("file", nargs="?", default=".gpuci.yml", type=Path)
    check.add_argument("--hosts", type=Path, help="hosts inventory JSON: which batch can run where")
    check.set_defaults(handler=cmd_config_check)

    acl = sub.add_parser(
        "redis-acl", help="print the Redis ACL file: the bot's user and one user per GPU host"
    )
    acl.add_argument("hosts", nargs="+", metavar="HOST", help="the GPU hosts' GPUCI_HOST names")
    acl.set_defaults(handler=cmd_redis_acl)

    gpus = sub.add_parser("gpus", help="this host's GPUs, idle or why not; exit 2 if unusable")
    gpus.add_argument("--json", action="store_true", help="print a hosts inventory (JSON)")
    gpus.add_argument(
        "--runtimes",
        action="store_true",
        help='with --json: each host as {"gpus": [...], "runtimes": [...]} (its bases, engine)',
    )
    gpus.set_defaults(handler=cmd_gpus)

    run = sub.add_parser("run-batch", help="run one batch on this host exactly as a worker would")
    run.add_argument("name", help="batch name from .gpuci.yml")
    run.add_argument("--config", type=Path, help="config file (default: SOURCE/.gpuci.yml)")
    run.add_argument("--source", type=Path, default=Path("."), help="source directory (default .)")
    run.add_argument("--sha", default="", help="commit to report (default: git HEAD of SOURCE)")
    run.add_argument("--json", type=Path, metavar="FILE", help="write the summary as JSON")
    run.add_argument("--markdown", type=Path, metavar="FILE", help="write the Check Run text")
    run.set_defaults(handler=cmd_run_batch)

    summarize = sub.add_parser("summarize", help="summary and Check Run text for JUnit files")
    summarize.add_argument("junit", nargs="+", type=Path)
    summarize.add_argument("--report", type=Path, help="gpuci_report JSON lines (XPASS, reruns)")
    summarize.add_argument("--batch", default="local", help="batch name to report")
    summarize.add_argument("--allow-no-tests", action="store_true")
    summarize.add_argument("--json", type=Path, metavar="FILE", help="write the summary as JSON")
    summarize.add_argument("--markdown", type=Path, metavar="FILE", help="write the Check Run text")
    summarize.set_defaults(handler=cmd_summarize)

    worker = sub.add_parser("worker", help="a GPU host: register its GPUs and run assigned batches")
    worker.add_argument("--host", help="this host's name (default: GPUCI_HOST or the hostname)")
    worker.add_argument(
        "--slots", type=int, help="runs at once (default: one per GPU, plus one for CPU batches)"
    )
    worker.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    worker.set_defaults(handler=cmd_worker)

    scheduler = sub.add_parser("scheduler", help="assign pending runs to GPU hosts (run one)")
    scheduler.set_defaults(handler=cmd_scheduler)

    redeliver = sub.add_parser(
        "redeliver",
        help="ask GitHub to send again the webhook deliveries gpuci missed",
        description=(
            "Ask GitHub to redeliver the App's webhook deliveries that failed (answered 5xx or "
            "not at all: the web process down, Redis unreachable) since the last check. The "
            "scheduler does this every minute by itself; run it by hand after the scheduler "
            "was down too, with --since to look further back (GitHub keeps deliveries 3 days). "
            "Needs the App key (run it on the bot host) and prints each redelivered GUID."
        ),
    )
    redeliver.add_argument(
        "--since",
        type=float,
        metavar="MINUTES",
        help="look back this many minutes (default: since the last check, less 5 minutes)",
    )
    redeliver.set_defaults(handler=cmd_redeliver)

    fakehub = sub.add_parser("fakehub", help="the offline GitHub for development and tests")
    fakehub.add_argument("--world", type=Path, required=True, help="world file (YAML)")
    fakehub.add_argument("--bind", default="127.0.0.1")
    fakehub.add_argument("--port", type=int, default=9000)
    fakehub.add_argument("--webhook-url", help="where to deliver webhooks")
    fakehub.add_argument("--webhook-secret", help="secret to sign webhooks with")
    fakehub.set_defaults(handler=cmd_fakehub)

    demo = sub.add_parser(
        "demo", help="the whole system on this machine, playing a maintainer's day on GitHub"
    )
    demo.add_argument("--once", action="store_true", help="exit at the end (no serving)")
    demo.set_defaults(handler=cmd_demo)
    return parser


def cmd_web(args: argparse.Namespace, settings: Settings) -> int:
    """gunicorn with bot.server.Worker, as the Procfile starts it, but refusing to start
    without a webhook secret (every delivery would be answered 401)."""
    from app import create_app
    from bot import server

    if not settings.webhook_secret:
        print(
            "gpuci web: set GPUCI_WEBHOOK_SECRET (the GitHub App's webhook secret)", file=sys.stderr
        )
        return EXIT_UNUSABLE
    _log_to_stderr(settings)
    server.run(lambda: create_app(settings), f"{args.bind}:{args.port}", args.workers)
    return EXIT_OK


def cmd_events(args: argparse.Namespace, settings: Settings) -> int:
    from redis import Redis
    from rq import SimpleWorker

    from bot.hostlink import HostLinkPump
    from bot.inbox import EVENTS_QUEUE, start_pump
    from bot.reporting import REPORTS_QUEUE

    if _github_app(settings, "events") is None:  # only the jobs use it; check it at start
        return EXIT_UNUSABLE
    _log_to_stderr(settings)
    # SimpleWorker: jobs run in this process, so the GitHub clients and their installation
    # tokens (bot.events.context) are built once and reused, not once per forked job.
    queues = [EVENTS_QUEUE, REPORTS_QUEUE]
    conn = Redis.from_url(settings.redis_url)
    # a thread, with a client of its own: accepted deliveries (the web's inbox) -> jobs
    start_pump(Redis.from_url(settings.redis_url, socket_timeout=30))
    # another: the GPU hosts' messages (started, finished with a report...) -> runs, reports
    HostLinkPump(Redis.from_url(settings.redis_url, socket_timeout=30)).start()
    # RQ's scheduler process (it runs the retries of failed jobs when they fall due) dies with a
    # Redis outage and is restarted by the worker's maintenance pass: every minute, not every
    # 10 (the blocking dequeue returns every worker_ttl - 15 s, so maintenance can run).
    worker = SimpleWorker(queues, connection=conn, worker_ttl=75, maintenance_interval=60)
    worker.work(with_scheduler=True)
    return EXIT_OK


def cmd_runs(args: argparse.Namespace, settings: Settings) -> int:
    from redis.exceptions import RedisError

    from bot.runs import list_runs
    from contract.redis_errors import DEFAULT_REDIS_URL, connect, describe, which_redis

    try:
        found = list_runs(connect(settings.redis_url, socket_timeout=5), args.limit)
    except RedisError as exc:
        print(f"gpuci runs: {describe(exc, settings.redis_url)}", file=sys.stderr)
        return EXIT_UNUSABLE
    if settings.redis_url == DEFAULT_REDIS_URL:  # an empty table must not look like "no runs"
        print(f"gpuci runs: read {which_redis(settings.redis_url)}", file=sys.stderr)
    if args.json:
        print(json.dumps([run.to_json() for run in found], indent=2))
        return EXIT_OK
    print(f"{'run':>6}  {'repo':<24} {'PR':>5}  {'sha':<10}  {'batch':<10} {'state':<17} detail")
    for run in found:
        detail = f"{run.conclusion}: {run.title}" if run.conclusion else run.wait_reason
        print(
            f"{run.run_id:>6}  {run.repo:<24} {run.pr or '-':>5}  {run.sha[:10]:<10}  "
            f"{run.batch:<10} {run.state:<17} {detail}"
        )
    return EXIT_OK


def cmd_history(args: argparse.Namespace, settings: Settings) -> int:
    """The batch's default-branch runs and failing tests, or one test's outcome per run."""
    from redis.exceptions import RedisError

    from bot import history
    from contract.redis_errors import connect, describe

    owner, _, name = args.repo.partition("/")
    if not (owner and name and "/" not in name) or any(c.isspace() for c in args.repo):
        print(f"gpuci history: {args.repo!r} is not a repository: give owner/name", file=sys.stderr)
        return EXIT_UNUSABLE
    conn = connect(settings.redis_url, socket_timeout=5)
    try:
        if args.test:
            found = history.test_summary(conn, args.repo, args.batch, args.test)
        else:
            found = history.batch_summary(conn, args.repo, args.batch)
    except RedisError as exc:
        print(f"gpuci history: {describe(exc, settings.redis_url)}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        print(_test_history_text(found) if args.test else _batch_history_text(found))
    return EXIT_OK


def _batch_history_text(found: dict[str, Any]) -> str:
    lines = [f"{found['repo']} batch {found['batch']}: {len(found['runs'])} runs on the default"
             " branch, oldest first"]  # fmt: skip
    if found["runs"]:
        lines.append(f"median duration {found['median_duration_s']:.1f} s")
    lines.append(f"{'run':>6}  {'sha':<12}  {'finished (UTC)':<19} {'seconds':>8} "
                 f"{'passed':>7} {'failed':>7} {'errors':>7} {'skipped':>8}")  # fmt: skip
    for r in found["runs"]:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["at"]))
        lines.append(
            f"{r['run']:>6}  {r['sha'][:12]:<12}  {at:<19} {r['duration']:>8.1f} "
            f"{r['passed']:>7} {r['failed']:>7} {r['errors']:>7} {r['skipped']:>8}"
        )
    lines.append("failing now:" if found["failing"] else "no test is failing on the default branch")
    for f in found["failing"]:
        day = time.strftime("%Y-%m-%d", time.gmtime(f["at"]))
        lines.append(f"  {f['test_id']}  since {f['sha'][:12]} ({day})")
    return "\n".join(lines)


def _test_history_text(found: dict[str, Any]) -> str:
    strip = "".join(r["outcome"] for r in found["runs"])
    lines = [
        f"{found['test_id']} in {found['repo']} batch {found['batch']}, oldest first:",
        f"  {strip or '(no runs recorded)'}   (p passed, f failed, e error, s skipped,"
        " x xfailed, X xpassed, - not run)",
    ]
    for r in found["runs"]:
        seconds = "" if r["seconds"] is None else f"{r['seconds']:.2f} s"
        extra = "  ".join(
            part for part in (f"{r['reruns']} reruns" if r["reruns"] else "", r["reason"]) if part
        )
        lines.append(f"  run {r['run']:>6}  {r['sha'][:12]}  {r['outcome']}  {seconds:>9}  {extra}")
    return "\n".join(lines)


def cmd_config_check(args: argparse.Namespace, settings: Settings) -> int:
    from contract.config import check_file

    issues = check_file(args.file, args.hosts)
    for issue in issues:
        print(issue)
    if issues:
        files = " and ".join(dict.fromkeys(issue.file for issue in issues))
        print(f"{len(issues)} problem(s) in {files}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{args.file}: ok" + (f" (every batch can run on {args.hosts})" if args.hosts else ""))
    return EXIT_OK


def cmd_gpus(args: argparse.Namespace, settings: Settings) -> int:
    from redis.exceptions import RedisError

    from contract import leases
    from contract.redis_errors import connect, describe
    from workers.gpus import (
        GpuBackendError,
        gpu_states,
        inventory_entry,
        open_backend,
        render_gpu_table,
    )

    try:
        backend = open_backend(settings.gpu_backend)
        indices = [g.index for g in backend.snapshot()]
    except GpuBackendError as exc:
        print(f"gpuci gpus: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    try:
        held = leases.holders(connect(settings.redis_url, socket_timeout=2), settings.host, indices)
        leased = {i: who for i, who in held.items() if who}
    except RedisError as exc:
        where = describe(exc, settings.redis_url)
        print(f"gpuci gpus: leases unknown ({where})", file=sys.stderr)
        leased = {}
    states = gpu_states(
        backend,
        leased,
        samples=settings.idle_samples,
        interval_s=settings.idle_sample_interval_s,
        idle_memory_mb=settings.idle_memory_mb,
    )
    runtimes = _host_runtimes(settings)
    entries = [inventory_entry(s) for s in states]
    if args.json and args.runtimes:
        provides = runtimes.provides() if not isinstance(runtimes, str) else []
        print(json.dumps({settings.host: {"gpus": entries, "runtimes": provides}}, indent=2))
    elif args.json:
        print(json.dumps({settings.host: entries}, indent=2))
    else:
        print(f"{settings.host} ({backend.describe()})")
        print(render_gpu_table(states))
        shown = runtimes if isinstance(runtimes, str) else runtimes.describe()
        print(f"runtimes: {shown}")
    if isinstance(runtimes, str):
        print(f"gpuci gpus: {runtimes}", file=sys.stderr)
    return EXIT_OK


def _host_runtimes(settings: Settings) -> Any:
    """The host's runtimes (workers.runtimes.HostRuntimes), or why its file is unusable."""
    from workers.runtimes import RuntimesError, load_host_runtimes

    try:
        return load_host_runtimes(settings.runtimes_file, sys.executable)
    except RuntimesError as exc:
        return str(exc)


def cmd_redis_acl(args: argparse.Namespace, settings: Settings) -> int:
    from contract.acl import acl_file
    from contract.hostlink import ProtocolError

    try:
        print(acl_file(args.hosts), end="")
    except ProtocolError as exc:
        print(f"gpuci redis-acl: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    return EXIT_OK


def cmd_run_batch(args: argparse.Namespace, settings: Settings) -> int:
    from redis.exceptions import RedisError

    from contract.config import ConfigError, check_file, load_config
    from contract.redis_errors import describe
    from workers.batch import BatchError, run_on_host, source_sha
    from workers.gpus import GpuBackendError

    source: Path = args.source.resolve()
    config_path: Path = args.config or source / ".gpuci.yml"
    issues = check_file(config_path, None)
    if issues:
        for issue in issues:
            print(issue, file=sys.stderr)
        return EXIT_UNUSABLE
    try:
        config = load_config(config_path.read_text(), str(config_path))
        result = run_on_host(
            settings=settings,
            config=config,
            batch_name=args.name,
            source=source,
            sha=args.sha or source_sha(source),
            progress=lambda msg: print(f"gpuci: {msg}", file=sys.stderr),
        )
    except (ConfigError, BatchError, GpuBackendError) as exc:
        print(f"gpuci run-batch: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    except RedisError as exc:
        print(
            f"gpuci run-batch: {describe(exc, settings.redis_url)}; GPU leases live there: "
            "start redis-server or set REDIS_URL",
            file=sys.stderr,
        )
        return EXIT_UNUSABLE
    _emit(result.output.title, result.output.summary, result.output.text, result.to_json(), args)
    print(f"log: {result.outcome.log_path}", file=sys.stderr)
    return EXIT_FAILED if result.conclusion.is_failure else EXIT_OK


def cmd_summarize(args: argparse.Namespace, settings: Settings) -> int:
    from contract.checks import conclude, render_check_output, summary_json
    from workers.junit import JUnitError, parse_junit

    missing = [str(p) for p in args.junit if not p.is_file()]
    if missing:
        print(f"gpuci summarize: no such file: {', '.join(missing)}", file=sys.stderr)
        return EXIT_UNUSABLE
    try:
        summary = parse_junit(args.junit, args.report)
    except JUnitError as exc:
        print(f"gpuci summarize: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    conclusion, title = conclude(summary, allow_no_tests=args.allow_no_tests)
    output = render_check_output(
        batch=args.batch, sha="", summary=summary, conclusion=conclusion, title=title, gpus=[]
    )
    data = summary_json(
        batch=args.batch, sha="", conclusion=conclusion, title=title, summary=summary, gpus=[]
    )
    _emit(output.title, output.summary, output.text, data, args)
    return EXIT_FAILED if conclusion.is_failure else EXIT_OK


def _emit(
    title: str, summary: str, text: str, data: dict[str, Any], args: argparse.Namespace
) -> None:
    """Print the Check Run as GitHub shows it; write the JSON and markdown files if asked."""
    from contract.checks import as_terminal

    markdown = f"# {title}\n\n{summary}\n" + (f"\n{text}\n" if text else "")
    print(as_terminal(markdown))
    if args.json:
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown)


def _github_app(settings: Settings, command: str) -> GitHubApp | None:
    """The App from the settings, or None after saying on stderr what is missing."""
    from bot.github_app import GitHubApp, GitHubAppError

    try:
        return GitHubApp.from_settings(settings)
    except GitHubAppError as exc:
        print(f"gpuci {command}: {exc}", file=sys.stderr)
        return None


def _log_to_stderr(settings: Settings) -> None:
    from contract.logs import configure

    configure(settings.log_format)


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    import dataclasses
    import os
    import signal

    from redis.exceptions import RedisError

    from contract.hostlink import ProtocolError, check_host_name
    from contract.redis_errors import connect, describe
    from workers.archive import ArchiveError, check_python
    from workers.cleanup import sweep_workdirs
    from workers.gpus import GpuBackendError, open_backend
    from workers.host import Host, HostHeartbeat, publish_host
    from workers.hostsetup import HostSetup, HostSetupError

    host = args.host or settings.host
    os.environ["GPUCI_HOST"] = host  # each run's process reads its settings again
    settings = dataclasses.replace(settings, host=host)
    try:
        check_host_name(host)
        check_python(sys.version_info[:3])  # every run extracts an archive (docs/deploy.md)
        backend = open_backend(settings.gpu_backend)
        slots = args.slots or len(backend.snapshot()) + 1
        setup = HostSetup.from_settings(settings)
    except (ArchiveError, GpuBackendError, HostSetupError, ProtocolError) as exc:
        print(f"gpuci worker: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    for warning in setup.warnings:
        print(f"gpuci worker: WARNING: {warning}", file=sys.stderr)
    sweep_workdirs(Path(settings.work_dir), time.time())
    provides = setup.runtimes.provides()
    conn = connect(settings.redis_url)
    worker = Host(conn, settings, slots)
    try:
        publish_host(conn, settings, backend, slots, provides)
        lost = worker.start()
    except RedisError as exc:
        print(f"gpuci worker: {describe(exc, settings.redis_url)}", file=sys.stderr)
        return EXIT_UNUSABLE
    _log_to_stderr(settings)
    print(f"gpuci worker: {host} ({backend.describe()}), {slots} slots")
    print(f"gpuci worker: {setup.describe()}")
    if lost:
        print(
            f"gpuci worker: runs {', '.join(lost)} had been taken when {host} last stopped: "
            "the bot re-queues them once, or fails them"
        )
    heartbeat = HostHeartbeat(conn, settings, backend, slots, provides)
    heartbeat.start()
    signal.signal(signal.SIGTERM, worker.stop)
    signal.signal(signal.SIGINT, worker.stop)
    try:
        worker.serve(burst=args.burst)
    finally:
        heartbeat.stop()
    return EXIT_OK


def cmd_scheduler(args: argparse.Namespace, settings: Settings) -> int:
    from redis import Redis

    from bot.redeliver import redeliver_failed, since_last_check
    from bot.runs import Run
    from bot.scheduler import Schedules, main_loop, stop_on_sigterm

    app = _github_app(settings, "scheduler")
    if app is None:
        return EXIT_UNUSABLE

    def source_token(run: Run) -> str:
        name = run.repo.split("/", 1)[1]
        return app.source_token(run.installation_id, name, recheck=run.trust == "approved")

    _log_to_stderr(settings)
    conn = Redis.from_url(settings.redis_url)
    schedules = Schedules(conn, app)

    def redeliver() -> list[str]:
        return redeliver_failed(app, conn, since_last_check(conn))

    stop = stop_on_sigterm()
    main_loop(conn, source_token, settings.github_api_url, stop, schedules, redeliver)
    return EXIT_OK


def cmd_redeliver(args: argparse.Namespace, settings: Settings) -> int:
    import time

    from github import GithubException
    from redis.exceptions import RedisError

    from bot.redeliver import redeliver_failed, since_last_check
    from contract.redis_errors import connect, describe

    app = _github_app(settings, "redeliver")
    if app is None:
        return EXIT_UNUSABLE
    conn = connect(settings.redis_url, socket_timeout=5)
    try:
        since = time.time() - args.since * 60 if args.since is not None else since_last_check(conn)
        redone = redeliver_failed(app, conn, since)
    except RedisError as exc:
        print(f"gpuci redeliver: {describe(exc, settings.redis_url)}", file=sys.stderr)
        return EXIT_UNUSABLE
    except GithubException as exc:
        print(f"gpuci redeliver: GitHub answered {exc.status}: {exc.data}", file=sys.stderr)
        return EXIT_FAILED
    for guid in redone:
        print(guid)
    print(f"redelivered {len(redone)} deliveries", file=sys.stderr)
    return EXIT_OK


def cmd_fakehub(args: argparse.Namespace, settings: Settings) -> int:
    from fakehub.server import serve

    serve(args.world, args.bind, args.port, args.webhook_url, args.webhook_secret)
    return EXIT_OK


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from bot.demo import run_demo

    return run_demo(settings, once=args.once)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
