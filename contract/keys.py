"""Every Redis key gpuci uses is built here, so the data model reads in one file."""

from __future__ import annotations

PREFIX = "gpuci"


# --- a GPU host's own keys --------------------------------------------------------------------
# Everything a GPU host may touch is under `gpuci:host:<name>` (its Redis user's whole ACL,
# `gpuci redis-acl`); host names are letters, digits, `.`, `_`, `-`, so no pattern of one host
# reaches another's keys. What a host writes is data the bot validates (contract.hostlink).


def host_keys(name: str) -> tuple[str, str]:
    """The two key patterns of one host, as its ACL user is given them."""
    return f"{PREFIX}:host:{name}", f"{PREFIX}:host:{name}:*"


def gpu_lease(host: str, index: int) -> str:
    """String: the owner token of the run holding GPU `index` on `host`; expires (TTL). The
    scheduler sets it (the host cannot take GPUs); the host renews and releases its own."""
    return f"{PREFIX}:host:{host}:lease:{index}"


def host_tickets(host: str) -> str:
    """List: tickets (contract.hostlink.Ticket JSON) the scheduler gave the host, oldest last."""
    return f"{PREFIX}:host:{host}:tickets"


def host_taken(host: str) -> str:
    """List: tickets the host took and is running (their source token already removed once
    the archive is fetched); a restarted host reports them lost."""
    return f"{PREFIX}:host:{host}:taken"


def host_outbox(host: str) -> str:
    """List: the host's messages to the bot (contract.hostlink.HostMessage JSON), oldest last."""
    return f"{PREFIX}:host:{host}:outbox"


def host_cancel(host: str) -> str:
    """Set: run ids the bot cancelled while they were assigned to or running on the host."""
    return f"{PREFIX}:host:{host}:cancel"


def host_junit(host: str, run_id: str) -> str:
    """String (gzip): the JUnit XML of a run the host finished, until the bot takes it."""
    return f"{PREFIX}:host:{host}:junit:{run_id}"


def host_messages_seen() -> str:
    """Hash "host:outcome" -> the count of its messages the bot read, by what it did."""
    return f"{PREFIX}:host-messages"


def host_messages_applying(host: str) -> str:
    """List: the host's message the bot is applying right now (normally empty; one left there
    by a bot process that died or lost Redis mid-way is applied again). Not the host's key."""
    return f"{PREFIX}:host-messages:applying:{host}"


def host_messages_rejected() -> str:
    """List: the last messages from hosts the bot refused, and why (JSON), for a human."""
    return f"{PREFIX}:host-messages:rejected"


def delivery(delivery_id: str) -> str:
    """String: present while a webhook delivery id counts as seen (dedupe, 7 days)."""
    return f"{PREFIX}:delivery:{delivery_id}"


def delivery_body(body_sha256: str) -> str:
    """String: present while a delivery with this body (SHA-256, hex) counts as seen: the
    same signed body under a new delivery id is a replay, not an event (7 days)."""
    return f"{PREFIX}:delivery-body:{body_sha256}"


# --- runs (bot/runs.py) ----------------------------------------------------------------------
# A run is one batch at one commit. Its states: awaiting_approval -> pending -> assigned ->
# running -> completed, or cancelled from any state before completed.


def _pr(repo: str, number: int) -> str:
    return f"{repo.lower()}#{number}"


def run_counter() -> str:
    """String (INCR): the last run id handed out; run ids are "1", "2", ..."""
    return f"{PREFIX}:run-ids"


def run(run_id: str) -> str:
    """Hash: one run, every field of `bot.runs.Run` (gpus as JSON, times as epoch seconds)."""
    return f"{PREFIX}:run:{run_id}"


def all_runs() -> str:
    """Sorted set: every run id, scored by creation time (for listing)."""
    return f"{PREFIX}:runs"


def pr_runs(repo: str, number: int) -> str:
    """Sorted set: the run ids of one PR (number 0: the default branch), scored by creation."""
    return f"{PREFIX}:runs:pr:{_pr(repo, number)}"


def sha_runs(repo: str, sha: str) -> str:
    """Set: the run ids at one commit of a repository (check suite re-runs)."""
    return f"{PREFIX}:runs:sha:{repo.lower()}:{sha}"


def pending_runs() -> str:
    """Sorted set: runs waiting for a GPU host; score = priority * 1e10 + created_at, so the
    lowest score is next: PR runs, then command/rerun/approval runs, then schedules; oldest
    first within a priority."""
    return f"{PREFIX}:runs:pending"


def approval(repo: str, number: int) -> str:
    """Hash {sha, approver, via, at}: the one approval of a PR, of exactly one commit."""
    return f"{PREFIX}:approval:{_pr(repo, number)}"


def heads(repo: str, number: int) -> str:
    """Hash sha -> epoch seconds when that commit most recently became the PR's head, as far as
    gpuci knows (30 days): whether a command's author can have seen the head it approves."""
    return f"{PREFIX}:heads:{_pr(repo, number)}"


def command_runs(repo: str, number: int) -> str:
    """Sorted set: runs a `/gpuci` command started on a PR, scored by start time (rate rule)."""
    return f"{PREFIX}:command-runs:{_pr(repo, number)}"


def check_runs(repo: str, sha: str, name: str) -> str:
    """Hash purpose -> check run id ("attempt" while a create is in flight): the Check Runs gpuci
    made called `name` at `sha`, so that handling an event again never creates a duplicate."""
    return f"{PREFIX}:checks:{repo.lower()}:{sha}:{name}"


# --- events (bot/events.py) ------------------------------------------------------------------


def inbox() -> str:
    """List: accepted deliveries not yet jobs, newest first (bot/inbox.py's envelopes)."""
    return f"{PREFIX}:inbox"


def inbox_moving() -> str:
    """List: envelopes an events process is turning into jobs right now (normally empty)."""
    return f"{PREFIX}:inbox:moving"


def inbox_unreadable() -> str:
    """List: inbox entries that could not be read, set aside for a human (last 100)."""
    return f"{PREFIX}:inbox:unreadable"


def role_below_write(repo: str, login: str) -> str:
    """String: a user's role on a repository, known to be below write (bot/outsiders.py; 60 s).
    Write and above are never remembered."""
    return f"{PREFIX}:role-below-write:{repo}:{login.lower()}"


def refusal_reply(repo: str, number: int, login: str) -> str:
    """String: the delivery whose reply told this user their `/gpuci` commands need write
    access on this PR (bot/outsiders.py; 1 hour): later ones get no reply."""
    return f"{PREFIX}:refusal-reply:{_pr(repo, number)}:{login.lower()}"


def delivery_steps(delivery_id: str) -> str:
    """Set: the effects (comments, reactions) already done for a delivery (7 days)."""
    return f"{PREFIX}:delivery-steps:{delivery_id}"


def installation(installation_id: int) -> str:
    """Hash {account, action, repositories (JSON), at}: the App's last news of an installation."""
    return f"{PREFIX}:installation:{installation_id}"


def dispatched_runs() -> str:
    """Set: run ids assigned to a host or running there (drained when the host is lost)."""
    return f"{PREFIX}:runs:dispatched"


def durations(repo: str, batch: str) -> str:
    """List: the last recorded durations (seconds) of a batch in a repository, newest first."""
    return f"{PREFIX}:durations:{repo}:{batch}"


def hosts() -> str:
    """Set: names of every GPU host that ever said hello (the bot adds them; hosts cannot)."""
    return f"{PREFIX}:hosts"


def host(name: str) -> str:
    """Hash {gpus (JSON inventory entries), backend, slots, runtimes, refusing, heartbeat_at,
    pid}: what the host says of itself (the bot reads it as untrusted data)."""
    return f"{PREFIX}:host:{name}"


def host_alive(name: str) -> str:
    """String with a TTL: present while the host's heartbeat is fresh."""
    return f"{PREFIX}:host:{name}:alive"


def result(run_id: str) -> str:
    """String (JSON): a finished run's summary, Check Run output and log tail (30 days)."""
    return f"{PREFIX}:result:{run_id}"


def junit(run_id: str) -> str:
    """String (gzip): a finished run's JUnit XML, for download from the dashboard (30 days)."""
    return f"{PREFIX}:junit:{run_id}"


def reported(run_id: str) -> str:
    """String: how many of a run's final Check Run updates GitHub has accepted (annotations
    are appended by GitHub, so each final update must go out exactly once, retries included)."""
    return f"{PREFIX}:reported:{run_id}"


def repos() -> str:
    """Hash repo full name -> installation id: every repository gpuci heard from (schedules)."""
    return f"{PREFIX}:repos"


def schedule_fired(repo: str, layer: str, minute: str) -> str:
    """String: a layer's schedule already fired in that minute (no double runs), 1 hour."""
    return f"{PREFIX}:schedule:{repo}:{layer}:{minute}"


# --- health and metrics (bot/web.py, bot/metrics.py) -----------------------------------------


def scheduler_alive() -> str:
    """String with a TTL: epoch seconds of the scheduler's last round; present while it beats."""
    return f"{PREFIX}:scheduler:alive"


def scheduler_leader() -> str:
    """String with a TTL: the leading scheduler's fencing token, "<term>:<holder>" (bot/leader.py).
    Writes that assign GPUs are refused unless it still holds the writer's token."""
    return f"{PREFIX}:scheduler:leader"


def scheduler_term() -> str:
    """Counter: the last leadership term handed out; each new leader takes the next one."""
    return f"{PREFIX}:scheduler:term"


def schedulers() -> str:
    """Sorted set holder -> epoch seconds each scheduler process (leading or standing by) was
    last seen; entries older than bot.leader.SEEN_S are gone."""
    return f"{PREFIX}:schedulers"


def webhook_counts() -> str:
    """Hash "event:outcome" -> deliveries answered so (outcomes in bot/webhooks.py; never
    expires). The event is "-" for a rejected delivery: unverified headers make no fields."""
    return f"{PREFIX}:webhook-counts"


def github_calls() -> str:
    """Hash "METHOD:status" -> REST calls made (status "none": no answer), plus "remaining": the
    rate-limit budget GitHub last reported."""
    return f"{PREFIX}:github-calls"


def leases_lost() -> str:
    """Hash cause -> GPU leases lost ("heartbeat": under a running batch, "before_start":
    between assignment and start, "host_lost": with a host whose heartbeat stopped)."""
    return f"{PREFIX}:leases-lost"


# --- missed webhooks (bot/redeliver.py) ------------------------------------------------------


def redeliver_checked() -> str:
    """String: epoch seconds of the last look at GitHub's failed webhook deliveries (the next
    look starts there, less an overlap); never expires."""
    return f"{PREFIX}:redeliver:checked"


# --- test history (bot/history.py) -----------------------------------------------------------
# Tests are numbered by a hash of their id (bot.history.test_number): no table of ids. Per
# batch and branch (the default branch, or one PR) the last runs' records, newest first,
# trimmed to the bounds of GPUCI_HISTORY_*.


def history_runs(repo: str, batch: str, branch: str) -> str:
    """List: run ids of the batch's recorded runs on `branch` ("default" or "pr:N"), newest
    first; PR lists expire 30 days after their last run."""
    return f"{PREFIX}:history:{repo.lower()}:{batch}:{branch}:runs"


def history_trend(repo: str, batch: str, branch: str) -> str:
    """List (JSON): the same runs' sha, time, duration and counts, newest first (plots)."""
    return f"{PREFIX}:history:{repo.lower()}:{batch}:{branch}:trend"


def history_record_prefix(repo: str) -> str:
    return f"{PREFIX}:history:{repo.lower()}:record:"


def history_record(repo: str, run_id: str) -> str:
    """String: one recorded run (bot.history.Record): a JSON head (the run, its host, GPU and
    runtime, reruns, skip reasons, its layout) and a column per field (outcome letters,
    seconds); 30 days for a PR's runs, trimmed by count on the default branch."""
    return f"{history_record_prefix(repo)}{run_id}"


def history_layout(repo: str, name: str) -> str:
    """String: the test numbers (uint64 each) of records that list the same tests in the same
    order, named by their hash; kept while a default-branch record uses it (history_layout_uses),
    else 30 days after the last PR run that did."""
    return f"{PREFIX}:history:{repo.lower()}:layout:{name}"


def history_layout_uses(repo: str) -> str:
    """Hash layout name -> how many of the repository's default-branch records use it."""
    return f"{PREFIX}:history:{repo.lower()}:layout-uses"


def history_failing(repo: str, batch: str) -> str:
    """Hash test number -> JSON {sha, at, id}: tests failing on the default branch, since which
    run (the first of their current streak)."""
    return f"{PREFIX}:history:{repo.lower()}:{batch}:failing"
