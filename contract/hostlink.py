"""The GPU host protocol. Work reaches a host as a Ticket, JSON on the host's own list; what the
host has to say comes back as HostMessages, JSON on its own outbox, which the bot validates
before anything reaches a run or GitHub. Nothing either side writes is unpickled, imported or
executed, and nothing a host writes is trusted for a run's identity (repository, installation,
Check Run, trust): the bot keeps those in its own records."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
SHA = re.compile(r"[0-9a-f]{40}")
REPO = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
RUN_ID = re.compile(r"[0-9]{1,18}")
MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # a finished run's result, with its failures' tracebacks
MAX_TEXT = 2000  # a reason or a note
MAX_LOG_TAIL = 64 * 1024  # an error message's log tail
TRUSTS = ("trusted", "approved")


class ProtocolError(ValueError):
    """A ticket or message that is not what the protocol allows; the message says what."""


def check_host_name(name: str) -> str:
    """A host's name, which is part of its Redis keys and its ACL patterns."""
    if not HOST_NAME.fullmatch(name):
        raise ProtocolError(
            f"host name {name!r} may use only letters, digits, '.', '_' and '-' (63 at most), "
            "starting with a letter or digit: set GPUCI_HOST"
        )
    return name


@dataclass(frozen=True)
class Ticket:
    """One run, as the scheduler hands it to the host it assigned it to: plain values only. The
    source token (one repository, `contents: read`, plus `pull_requests: read` for approved
    fork code) is used only to fetch the archive and, for approved runs, to re-check the PR."""

    run_id: str
    repo: str
    sha: str
    batch: str
    config_text: str
    gpu_indices: tuple[int, ...]
    lease_owner: str
    api_url: str
    source_token: str
    trust: str  # "trusted", or "approved": a writer approved exactly this SHA of a PR
    pr: int = 0
    approver: str = ""
    deadline: float = 0.0  # epoch seconds after which the ticket must not start

    def to_json(self) -> str:
        data = asdict(self)
        data["gpu_indices"] = list(self.gpu_indices)
        return json.dumps(data)

    def without_token(self) -> Ticket:
        return Ticket(**{**self.__dict__, "source_token": ""})

    @classmethod
    def from_json(cls, raw: bytes | str) -> Ticket:
        data = _object(raw, "ticket")
        try:
            ticket = cls(**{**data, "gpu_indices": tuple(data.get("gpu_indices", ()))})
        except TypeError as exc:
            raise ProtocolError(f"ticket has unexpected or missing fields: {exc}") from None
        ticket.validate()
        return ticket

    def validate(self) -> None:
        _match(RUN_ID, self.run_id, "ticket run_id")
        _match(REPO, self.repo, "ticket repo")
        _match(SHA, self.sha, "ticket sha")
        if self.trust not in TRUSTS:
            raise ProtocolError(f"ticket trust {self.trust!r} is not trusted or approved")
        if self.trust == "approved" and (self.pr <= 0 or not self.approver):
            raise ProtocolError("an approved ticket names its PR and approver")
        if not all(isinstance(i, int) and 0 <= i < 1024 for i in self.gpu_indices):
            raise ProtocolError("ticket gpu_indices must be GPU indices")


class Kind(StrEnum):
    HELLO = "hello"  # the host (re)started: runs it was running are lost
    STARTED = "started"  # checks passed, the batch starts
    NOT_STARTED = "not_started"  # it did not start: back to pending (retry) or failed
    FINISHED = "finished"  # the batch ended; `result` says how
    LEASE_LOST = "lease_lost"  # the run's GPU leases were lost (for /metrics)
    # gpuci's own code raised on the host while it held the run: the run ends as failure;
    # `reason` is the exception, `result` at most {"log_tail": the run's log so far}
    ERROR = "error"


@dataclass(frozen=True)
class HostMessage:
    kind: Kind
    run_id: str = ""
    lease_owner: str = ""
    reason: str = ""
    retry: bool = False
    result: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        data = asdict(self)
        data["kind"] = str(self.kind)
        return json.dumps(data)

    @classmethod
    def from_json(cls, raw: bytes | str) -> HostMessage:
        if len(raw) > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"message over {MAX_MESSAGE_BYTES} bytes")
        data = _object(raw, "message")
        try:
            kind = Kind(data.pop("kind", ""))
            message = cls(kind=kind, **data)
        except (ValueError, TypeError) as exc:
            raise ProtocolError(f"not a host message: {exc}") from None
        message.validate()
        return message

    def validate(self) -> None:
        if self.kind is not Kind.HELLO:
            _match(RUN_ID, self.run_id, "message run_id")
            if not isinstance(self.lease_owner, str) or not self.lease_owner:
                raise ProtocolError("a run's message names its lease owner")
        if not isinstance(self.reason, str) or len(self.reason) > MAX_TEXT:
            raise ProtocolError(f"reason must be text of at most {MAX_TEXT} characters")
        if not isinstance(self.retry, bool) or not isinstance(self.result, dict):
            raise ProtocolError("retry is a boolean and result an object")
        if self.kind is Kind.FINISHED and not self.result:
            raise ProtocolError("a finished message carries its result")
        if self.kind is Kind.ERROR:
            tail = self.result.get("log_tail", "")
            if set(self.result) - {"log_tail"} or not isinstance(tail, str):
                raise ProtocolError("an error message's result is at most its log tail (text)")
            if len(tail) > MAX_LOG_TAIL:
                raise ProtocolError(f"an error's log tail is over {MAX_LOG_TAIL} characters")


def _object(raw: bytes | str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"{what} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError(f"{what} is not a JSON object")
    return data


def _match(pattern: re.Pattern[str], value: Any, what: str) -> None:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ProtocolError(f"{what} {value!r} is not valid")
