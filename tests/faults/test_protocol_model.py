"""A model-based test of the delivery protocol.

A hypothesis ``RuleBasedStateMachine`` drives the app's real code against the
real Redis and the real database (no mocks): every step is one thing a
request, a worker, the sweeper, an operator or a fault can do, and after every
step the invariants are checked. Each example starts from an empty
Redis database and empty outbox tables, and ends by draining the outbox.

The steps are ``tests/faults/protocol_steps.py``'s; the invariants and the
draining are ``tests/faults/protocol_machine.py``'s. 35 examples of up to 30
steps run by default; ``OUTBOX_TEST_MODEL_EXAMPLES=600`` searches deeper. The
machine's finds, replayed by hand: ``tests/faults/test_protocol_model_finds.py``.
"""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from tests import protocol_faults as pf
from tests.faults.protocol_machine import ProtocolMachine
from tests.faults.protocol_steps import RULES_RUN, STEPS

pytestmark = pytest.mark.django_db(transaction=True)


def test_protocol_model() -> None:
    started = time.monotonic()
    RULES_RUN.clear()
    STEPS.clear()
    pf.FIRED.clear()
    try:
        with pf.module_sites():
            _run()
    finally:
        # Shown with -s: what the examples exercised, and how long they took.
        seconds = time.monotonic() - started
        print(f"\nprotocol model: {len(STEPS)} examples, {sum(STEPS)} steps, {seconds:.1f}s")
        print("what the steps did:", dict(sorted(RULES_RUN.items())))
        print("faults fired:", dict(sorted(pf.FIRED.items())))


def _run() -> None:
    run_state_machine_as_test(
        ProtocolMachine,
        settings=settings(
            max_examples=int(os.environ.get("OUTBOX_TEST_MODEL_EXAMPLES", "35")),
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.filter_too_much,
                HealthCheck.data_too_large,
            ],
        ),
    )
