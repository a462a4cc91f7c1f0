"""Test-only fault injection: `GPUCI_TEST_FAULT=STEP` makes every run on the host raise at that
step of its run path, so tests can show that whatever raises there ends the run (as failure,
"gpuci error on HOST: ...") rather than leaving it `running`. Never set it in production."""

from __future__ import annotations

from contract.settings import FAULT_STEPS

STEPS = FAULT_STEPS


class InjectedFault(RuntimeError):
    """The fault GPUCI_TEST_FAULT asked for."""


def inject(fault_at: str, step: str) -> None:
    """Raise here if the test asked for a fault at `step`."""
    if fault_at == step:
        raise InjectedFault(f"injected fault at step {step!r} (GPUCI_TEST_FAULT)")
