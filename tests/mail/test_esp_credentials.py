"""An ESP's configuration mistakes stop nothing and burn nothing (the mailer's pause).

A missing setting is check ``outbox.E027``, and the worker refuses to start;
a backend that cannot be created at run time, or an ESP that answers 401 or
403, pauses that mailer alone (``queue/control.py``, ``refuse``): its rows
stay ``queued`` with their attempts as they were, the log says so once per
pause, and the first send after the pause that the ESP takes ends it. The ESP
is ``tests/esp.py`` (a real HTTP server speaking Postmark and Mailgun), reached
by anymail's real backends from real worker processes.
"""

from __future__ import annotations

import re
import signal
import time

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.mail import EmailMessage
from django.utils.module_loading import import_string

from outbox import enqueue_email
from outbox.mail.failures import FailureKind, classify, configuration_refused
from outbox.mail.mailers import get_connection
from outbox.mail.targets import HAS_MAILERS
from outbox.models import Attempt, Delivery
from outbox.queue import control
from outbox.status import collect, render
from tests.cells import EACH_DJANGO_AND_DATABASE, slow_processes
from tests.delivery import deliver, use_outbox
from tests.esp import MAILGUN_BACKEND, POSTMARK_BACKEND, FakeESP, anymail_settings, worker_env
from tests.processes import Run
from tests.servers import wait_until

pytestmark = slow_processes(
    EACH_DJANGO_AND_DATABASE,
    why="real worker processes against a fake ESP; one cell per Django and database",
)

Status = Delivery.Status
Outcome = Attempt.Outcome
TIMEOUT = 2.0  # anymail's REQUESTS_TIMEOUT
TOKEN = "tests-only-server-token"  # tests/esp.py anymail_settings(): what the workers send
PAUSE = "1,2"  # OUTBOX["MAILER_PAUSE"] of the worker processes: 1 s, 2 s, 2 s, ...


@pytest.fixture(autouse=True)
def fresh(esp: FakeESP, settings) -> None:
    esp.reset()
    settings.ANYMAIL = anymail_settings(esp.url, TIMEOUT)


def delivering(settings, default: str, bulk: str | None = None) -> None:
    """This process's settings as the workers': the default target, and the mailer "bulk"."""
    if HAS_MAILERS:
        mailers = {a: m for a, m in settings.MAILERS.items() if a != "bulk"}
        mailers["delivery"] = {"BACKEND": default}
        if bulk:
            mailers["bulk"] = {"BACKEND": bulk}
        settings.MAILERS = mailers
    else:
        backends = {"bulk": bulk} if bulk else {}
        settings.OUTBOX = {**settings.OUTBOX, "EMAIL_BACKEND": default, "BACKENDS": backends}


def env(esp: FakeESP, **extra: str) -> dict[str, str]:
    """A worker delivering through Postmark, with the mailer "bulk" through Mailgun."""
    return worker_env(
        esp,
        TIMEOUT,
        **{"OUTBOX_TEST_BULK_BACKEND": MAILGUN_BACKEND, "OUTBOX_TEST_MAILER_PAUSE": PAUSE, **extra},
    )


def rows(settings, default: int, bulk: int) -> tuple[list[Delivery], list[Delivery]]:
    delivering(settings, POSTMARK_BACKEND, MAILGUN_BACKEND)
    first = [enqueue_email("Hi", "Body", None, [f"d{i}@example.com"])[0] for i in range(default)]
    second = [
        enqueue_email("Hi", "Body", None, [f"b{i}@example.com"], mailer="bulk")[0]
        for i in range(bulk)
    ]
    return first, second


def statuses(deliveries: list[Delivery]) -> list[tuple[str, int]]:
    """(status, attempts) of each row, read again."""
    found = {
        d.pk: (d.status, d.attempts)
        for d in Delivery.objects.filter(pk__in=[r.pk for r in deliveries])
    }
    return [found[r.pk] for r in deliveries]


def burst(worker_process, *args: str, **extra: str) -> tuple[int, str]:
    run = Run(worker_process("--burst", "--concurrency", "1", *args, **extra))
    code = run.proc.wait(timeout=60)
    run.reader.join(timeout=10)
    return code, run.output()


# -- what the errors mean (one request each, in this process) ----------------------


def send_error(backend: str) -> BaseException:
    message = EmailMessage("Hi", "Body", "from@example.com", ["bob@example.com"])
    with pytest.raises(Exception) as info:
        import_string(backend)().send_messages([message])
    return info.value


@pytest.mark.parametrize("backend", [POSTMARK_BACKEND, MAILGUN_BACKEND])
def test_a_401_is_the_mailers_credential_refused_not_the_message(esp, backend):
    esp.server_token = esp.api_key = "the right one"
    exc = send_error(backend)
    why = configuration_refused(exc)
    assert why is not None and "refused its credential (HTTP 401" in why
    if backend == POSTMARK_BACKEND:
        assert "ErrorCode" in why and "valid Server token" in why
    # A refusal of the message is the message's: not the mailer's.
    esp.server_token = esp.api_key = None
    esp.plan["bob@example.com"] = ["422"]
    refused = send_error(backend)
    assert configuration_refused(refused) is None
    assert classify(refused) is FailureKind.PERMANENT
    esp.plan["bob@example.com"] = ["500"]
    assert configuration_refused(send_error(backend)) is None


def test_postmarks_refusal_of_the_accounts_sending_is_the_mailers_not_the_message(esp):
    """A 422 whose ErrorCode is about the account (a sender signature) pauses the mailer."""
    esp.plan["bob@example.com"] = ["unsigned"]
    why = configuration_refused(send_error(POSTMARK_BACKEND))
    assert why is not None and why.startswith("Postmark refused the account's sending (HTTP 422")
    assert '"ErrorCode": 400' in why and "is not a Sender Signature" in why


def test_an_unconfirmed_sender_spends_no_attempt_and_pauses_the_mailer_alone(
    esp, settings, worker_process
):
    default, bulk = rows(settings, default=3, bulk=2)
    esp.plan.update({d.recipient: ["unsigned"] for d in default})
    code, output = burst(worker_process, **env(esp, OUTBOX_TEST_MAILER_PAUSE="60,600"))
    assert code == 0, output
    assert statuses(bulk) == [(Status.SENT, 1)] * 2
    assert statuses(default) == [(Status.QUEUED, 0)] * 3
    # One request met the refusal; the mailer's other rows were held without a request.
    assert [action for _to, action in esp.requests].count("unsigned") == 1
    [released] = Attempt.objects.filter(delivery__in=default)
    assert released.outcome == Outcome.RELEASED and "Sender Signature" in released.error
    [line] = [x for x in output.splitlines() if "paused for" in x]
    assert "the default mailer" in line and "Postmark refused the account's sending" in line


def test_a_backend_that_cannot_be_created_is_the_mailers_configuration(settings):
    del settings.ANYMAIL["POSTMARK_SERVER_TOKEN"]
    with pytest.raises(ImproperlyConfigured) as info:
        import_string(POSTMARK_BACKEND)()
    why = configuration_refused(info.value)
    assert why is not None and "POSTMARK_SERVER_TOKEN" in why
    # A mailer this host does not know is not paused for every host: it fails as before.
    with pytest.raises(ImproperlyConfigured) as unknown:
        get_connection("nowhere")
    assert configuration_refused(unknown.value) is None


# -- the check: before the worker starts -------------------------------------------


def e027() -> list[str]:
    return [m.msg for m in run_checks() if m.id == "outbox.E027"]


def test_e027_names_the_missing_setting_of_each_anymail_backend(esp, settings):
    delivering(settings, POSTMARK_BACKEND, MAILGUN_BACKEND)
    assert e027() == []
    del settings.ANYMAIL["POSTMARK_SERVER_TOKEN"]
    del settings.ANYMAIL["MAILGUN_API_KEY"]
    default, bulk = e027()
    # anymail's own words: the ANYMAIL setting's name, or on 6.1 the MAILERS option's.
    assert re.search("server_token", default, re.I) and "delivery" in default
    assert "the mailer 'bulk'" in bulk and re.search("api_key", bulk, re.I)
    assert esp.requests == []  # created, never opened: no request
    # Only anymail's backends are created here.
    delivering(settings, "django.core.mail.backends.locmem.EmailBackend")
    assert e027() == []


def test_the_worker_refuses_to_start_without_the_token(esp, settings, worker_process):
    [row] = enqueue_email("Hi", "Body", None, ["early@example.com"])
    code, output = burst(worker_process, **env(esp, OUTBOX_TEST_POSTMARK_TOKEN=""))
    assert code == 1, output
    assert "outbox.E027" in output and re.search("server_token", output, re.I)
    assert statuses([row]) == [(Status.QUEUED, 0)] and esp.requests == []


# -- at run time: the mailer pauses, its rows stay queued, the others go ----------------


def test_a_backend_missing_its_setting_at_run_time_pauses_its_mailer_alone(
    esp, settings, worker_process
):
    """Checks skipped: before, the sender thread crashed and --burst exited 1."""
    default, bulk = rows(settings, default=2, bulk=2)
    code, output = burst(worker_process, "--skip-checks", **env(esp, OUTBOX_TEST_POSTMARK_TOKEN=""))
    assert code == 0, output
    assert "crashed" not in output
    assert statuses(bulk) == [(Status.SENT, 1)] * 2
    assert statuses(default) == [(Status.QUEUED, 0)] * 2
    [released] = Attempt.objects.filter(delivery__in=default)
    assert released.outcome == Outcome.RELEASED and re.search("server_token", released.error, re.I)
    assert len(re.findall(r"the default mailer paused for \d+s \(1 in a row\)", output)) == 1
    paused = control.state().paused_mailers[""]
    assert re.search("server_token", paused.why, re.I)
    # Due when the pause ends, not before.
    for row in Delivery.objects.filter(pk__in=[r.pk for r in default]):
        assert row.not_before.timestamp() >= paused.until - 0.01


def test_a_401_pauses_the_mailer_burst_exits_0_and_the_other_mailer_sends(
    esp, settings, worker_process, admin_client
):
    esp.server_token = "rotated"  # the workers still send the old one
    default, bulk = rows(settings, default=3, bulk=2)
    code, output = burst(worker_process, **env(esp, OUTBOX_TEST_MAILER_PAUSE="60,600"))
    assert code == 0, output
    assert statuses(bulk) == [(Status.SENT, 1)] * 2
    assert statuses(default) == [(Status.QUEUED, 0)] * 3
    # One request met the refusal; the rest of the mailer's rows waited (held, no request).
    assert [action for _to, action in esp.requests].count("401") == 1
    [released] = Attempt.objects.filter(delivery__in=default)
    assert released.outcome == Outcome.RELEASED
    assert "HTTP 401" in released.error and "valid Server token" in released.error
    [line] = [x for x in output.splitlines() if "paused for" in x]
    assert "the default mailer" in line and "Postmark refused its credential" in line
    assert "ErrorCode" in line
    # outbox_status and the dashboard say which mailer waits, and why.
    text = render(collect())
    assert re.search(r"the default mailer: PAUSED for \d+s more \(1 in a row\): Postmark", text)
    page = admin_client.get("/admin/outbox/dashboard/").content.decode()
    assert 'id="outbox-paused-mailers"' in page and "valid Server token" in page


def test_a_long_running_worker_tries_again_after_each_pause_and_a_fixed_token_lets_mail_flow(
    esp, settings, worker_process
):
    esp.server_token = "rotated"
    default, bulk = rows(settings, default=3, bulk=1)
    run = Run(worker_process("--concurrency", "2", **env(esp)))
    try:
        # Paused (1 s), tried again, refused again: the next pause is longer.
        wait_until(lambda: [a for _to, a in esp.requests].count("401") >= 2, 20)
        paused = wait_until(lambda: control.state().paused_mailers.get(""), 5)
        wait_until(lambda: control.state().paused_mailers[""].count >= 2, 10)
        assert statuses(bulk) == [(Status.SENT, 1)]
        assert set(statuses(default)) <= {(Status.QUEUED, 0), (Status.PROCESSING, 1)}
        assert (
            Attempt.objects.filter(delivery__in=default).exclude(outcome=Outcome.RELEASED).count()
            == 0
        )
        # The credential is fixed (here: the ESP takes the token the workers send).
        esp.server_token = TOKEN
        wait_until(lambda: statuses(default) == [(Status.SENT, 1)] * 3, 20)
        assert wait_until(lambda: "" not in control.state().paused_mailers, 5)
        assert paused.why and "valid Server token" in paused.why
    finally:
        code = run.finish(signal.SIGTERM)
    output = run.output()
    assert code == 0, output
    pauses = re.findall(r"the default mailer paused for \d+s \((\d+) in a row\)", output)
    assert pauses[:2] == ["1", "2"] and len(pauses) == len(set(pauses))  # once per pause
    assert output.count("the default mailer: its ESP took a message again; sending resumed") == 1


def test_a_drop_in_messages_rows_are_released_together_and_sent_in_one_request_after_the_fix(
    esp, settings
):
    """The rows of one ESP request (the claimed row and its companions) wait alike."""
    use_outbox(settings, POSTMARK_BACKEND, MAILER_PAUSE=(0.5, 1.0))
    esp.server_token = "rotated"
    message = EmailMessage("Hi", "Body", "shop@example.com", ["a@example.com", "b@example.com"])
    assert message.send(fail_silently=False) == 1
    message = EmailMessage(
        "Hi", "Body", "shop@example.com", ["c@example.com"], cc=["d@example.com"]
    )
    assert message.send() == 1
    deliver()
    found = list(Delivery.objects.order_by("pk"))
    assert statuses(found) == [(Status.QUEUED, 0)] * 4
    assert [a for _to, a in esp.requests] == ["401"]  # the second message waited: no request
    paused = control.state().paused_mailers[""]
    released = Attempt.objects.filter(outcome=Outcome.RELEASED)
    assert sorted(a.delivery_id for a in released) == [d.pk for d in found[:2]]
    for row in found:
        assert row.not_before.timestamp() >= paused.until - 0.01
    # Fixed: after the pause, each message goes in one request, and the pause is forgotten.
    esp.server_token = TOKEN
    wait_until(lambda: time.time() >= paused.until, 5)
    deliver()
    assert statuses(found) == [(Status.SENT, 1)] * 4
    assert [a for _to, a in esp.requests] == ["401", "ok", "ok"]
    assert control.state().paused_mailers == {}
