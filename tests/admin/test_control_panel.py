"""The dashboard's "Sending control" panel: the switches and limits it shows, and its buttons.

Real Redis, the Django test client, the same ``outbox.queue.control`` the commands use.
"""

from __future__ import annotations

import logging
import re

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from outbox.queue import control, ratelimit
from outbox.queue.ratelimit import take

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/admin/outbox/dashboard/"
CONTROL_URL = "/admin/outbox/dashboard/control/"
PAUSED_MESSAGE = "Sending paused. Messages already being handed over finish."


def staff(django_user_model, username: str, *codenames: str):
    user = django_user_model.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="outbox", codename__in=codenames)
    )
    return user


@pytest.fixture
def viewer(client, django_user_model):
    client.force_login(staff(django_user_model, "viewer", "view_delivery"))
    return client


@pytest.fixture
def changer(client, django_user_model):
    client.force_login(staff(django_user_model, "oncall-anna", "view_delivery", "change_delivery"))
    return client


def page(client) -> str:
    response = client.get(URL)
    assert response.status_code == 200
    return response.content.decode()


def shown_state(html: str) -> str:
    match = re.search(r'id="outbox-control-state" data-state="([a-z]+)"', html)
    assert match, "no sending-control panel"
    return match.group(1)


def forms_to_control(html: str) -> list[str]:
    """The forms on the page that POST to the buttons' URL."""
    return re.findall(rf'<form method="post" action="{CONTROL_URL}"[^>]*>.*?</form>', html, re.S)


def press(client, action: str, domain: str = ""):
    data = {"action": action, **({"domain": domain} if domain else {})}
    return client.post(CONTROL_URL, data)


def test_the_urls_are_named():
    assert reverse("admin:outbox_control") == CONTROL_URL


# -- what the panel shows ---------------------------------------------------------------


def test_unknown_before_anything_ran_then_running(viewer, queue):
    html = page(viewer)
    assert shown_state(html) == "unknown"
    assert "UNKNOWN" in html and "Redis holds no pause switches" in html
    # Reading them creates nothing: their absence must keep meaning "not known".
    assert shown_state(page(viewer)) == "unknown"
    assert not queue.redis.exists(queue.control_key)
    control.resume(queue=queue)  # creates the switches, as every worker's start does
    html = page(viewer)
    assert shown_state(html) == "running"
    assert "outbox-control-lost" not in html
    assert 'id="outbox-control-no-domains"' in html and "outbox-control-domains" not in html


def test_the_panel_shows_a_pause_made_by_the_command(viewer, queue):
    state = control.pause(queue=queue)
    html = page(viewer)
    assert shown_state(html) == "paused"
    assert "PAUSED" in html
    context = viewer.get(URL).context
    assert context["control"]["paused_since"].timestamp() == pytest.approx(state.paused_since)


def test_paused_and_slowed_domains_with_their_wait(viewer, queue):
    control.pause("gmail.com", queue=queue)
    control.slow_down("slow.example", 90, queue=queue)
    control.slow_down("*", 30, queue=queue)
    control.slow_down("over.example", 0.001, queue=queue)  # its wait is over by the render
    html = page(viewer)
    assert shown_state(html) == "running"
    paused = re.findall(r'<tr class="outbox-paused-domain"><td><code>([^<]+)</code>', html)
    assert paused == ["gmail.com"]
    slow = viewer.get(URL).context["control"]["slow_domains"]
    assert [row["domain"] for row in slow] == ["*", "slow.example"]
    assert slow[1]["remaining"] in ("1 min 30 s", "1 min 29 s", "1 min 28 s")
    assert "every domain" in html and "slow.example" in html
    assert "outbox-control-no-domains" not in html
    assert "over.example" not in html


def test_redis_lost_the_switches_is_shown_until_a_resume(changer, queue):
    seen = control.pause(queue=queue)
    queue.redis.delete(queue.control_key)  # Redis lost them
    assert shown_state(page(changer)) == "unknown"
    control.sync(queue, seen)  # what a worker does when it finds them gone
    html = page(changer)
    assert shown_state(html) == "paused"
    assert 'id="outbox-control-lost"' in html and "Redis lost the switches" in html
    assert 'id="outbox-resume"' in html
    press(changer, "resume")
    html = page(changer)
    assert shown_state(html) == "running" and "outbox-control-lost" not in html


def test_each_rate_limit_with_its_use_held_backlog_and_next_slot(viewer, queue, settings):
    settings.OUTBOX = {**settings.OUTBOX, "RATE_LIMITS": {"*": "1000/d", "example.org": "4/d"}}
    configured = ratelimit.limits()
    checks = ratelimit.applicable("example.org", configured)
    assert take(queue, 1, checks)[1] is None  # sent now
    assert take(queue, 2, checks)[1] is not None  # held for the next slot, 6 h on
    response = viewer.get(URL)
    html = response.content.decode()
    rows = {row["key"]: row for row in response.context["control"]["limits"]}
    for use in ratelimit.usage(queue):
        row = rows[use.key]
        assert (row["used"], row["capacity"], row["held"]) == (use.used, use.capacity, use.held)
    assert (rows["example.org"]["used"], rows["example.org"]["held"]) == (1, 1)
    assert rows["example.org"]["percent"] == 25
    # One slot sent, the next (6 h on) reserved: the next free one is 12 h on.
    assert rows["example.org"]["next_free"] in ("11 h 59 min", "12 h 0 min")
    assert rows["*"]["next_free"].startswith("1 min 2")  # 1000/d: one every 86.4 s
    assert (rows["*"]["used"], rows["*"]["held"]) == (1, 0)
    assert '<tr class="outbox-rate-limit" data-key="example.org">' in html
    assert "1 / 4 (25 %)" in html and "1 / 1000 (0 %)" in html
    assert "No rate limits are set" not in html


def test_no_rate_limits_says_so(viewer):
    html = page(viewer)
    assert 'id="outbox-no-rate-limits"' in html and "outbox-rate-limit" not in html


def test_redis_down_shows_no_state_and_no_buttons(changer, settings):
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens on port 1
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5},
        }
    }
    html = page(changer)
    assert shown_state(html) == "unavailable"
    assert forms_to_control(html) == []


# -- the buttons: who sees them, who may press them -----------------------------------------


def test_the_buttons_are_there_for_a_user_who_may_change_deliveries(changer, queue):
    control.resume(queue=queue)
    html = page(changer)
    forms = forms_to_control(html)
    assert any('id="outbox-pause"' in form for form in forms)
    assert all("csrfmiddlewaretoken" in form for form in forms)
    assert 'id="outbox-resume"' not in html  # running: nothing to resume
    control.pause(queue=queue)
    html = page(changer)
    assert 'id="outbox-resume"' in html and 'id="outbox-pause"' not in html


def test_a_view_only_user_sees_the_state_without_buttons(viewer, queue):
    control.pause(queue=queue)
    control.pause("gmail.com", queue=queue)
    html = page(viewer)
    assert shown_state(html) == "paused" and "gmail.com" in html
    assert forms_to_control(html) == []
    for button in ("outbox-pause", "outbox-resume", "outbox-domain-form"):
        assert f'id="{button}"' not in html


def test_pause_and_resume_as_a_user_who_may_change(changer, queue, caplog):
    control.resume(queue=queue)
    with caplog.at_level(logging.INFO, logger="outbox.queue.control"):
        response = press(changer, "pause")
    assert response.status_code == 302 and response["Location"] == URL
    assert control.state(queue).paused
    # Who paused is in the log, for the operator who wonders.
    assert "sending paused by oncall-anna (admin dashboard)" in caplog.text
    followed = changer.get(response["Location"])
    assert [str(m) for m in followed.context["messages"]] == [PAUSED_MESSAGE]
    assert shown_state(followed.content.decode()) == "paused"

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="outbox.queue.control"):
        response = press(changer, "resume")
    assert response.status_code == 302
    assert not control.state(queue).paused
    assert "sending resumed by oncall-anna (admin dashboard)" in caplog.text
    assert [str(m) for m in changer.get(URL).context["messages"]] == ["Sending resumed."]


def test_a_view_only_user_may_not_press_them(viewer, queue):
    control.resume(queue=queue)
    assert press(viewer, "pause").status_code == 403
    assert not control.state(queue).paused
    control.pause(queue=queue)
    assert press(viewer, "resume").status_code == 403
    assert control.state(queue).paused
    assert press(viewer, "resume", "gmail.com").status_code == 403


def test_anonymous_and_non_staff_are_sent_to_the_login_page(client, django_user_model, queue):
    control.resume(queue=queue)
    assert press(client, "pause").status_code == 302
    user = django_user_model.objects.create_user("customer", password="pw")
    user.user_permissions.add(*Permission.objects.filter(codename="change_delivery"))
    client.force_login(user)
    response = press(client, "pause")
    assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))
    assert not control.state(queue).paused


def test_a_post_without_the_csrf_token_is_refused(django_user_model, queue):
    control.resume(queue=queue)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(staff(django_user_model, "changer", "view_delivery", "change_delivery"))
    assert press(browser, "pause").status_code == 403
    assert not control.state(queue).paused


def test_only_post_is_accepted(changer, queue):
    control.resume(queue=queue)
    assert changer.get(CONTROL_URL, {"action": "pause"}).status_code == 405
    assert not control.state(queue).paused


def test_pause_and_resume_one_domain(changer, queue):
    response = press(changer, "pause", " GMail.com ")
    assert response.status_code == 302
    state = control.state(queue)
    assert set(state.paused_domains) == {"gmail.com"} and not state.paused
    html = changer.get(URL).content.decode()
    assert "Mail to gmail.com paused" in html
    # Its row has a resume button of its own.
    [row_form] = [f for f in forms_to_control(html) if 'value="gmail.com"' in f]
    assert 'name="action" value="resume"' in row_form
    control.pause(queue=queue)
    press(changer, "resume")
    assert [str(m) for m in changer.get(URL).context["messages"]] == [
        "Sending resumed; still paused: gmail.com."
    ]
    press(changer, "resume", "gmail.com")
    assert control.state(queue).paused_domains == {}


@pytest.mark.parametrize("data", [{"action": "pause", "domain": "not a domain"}, {"action": "x"}])
def test_bad_input_changes_nothing_and_says_why(changer, queue, data):
    control.resume(queue=queue)
    response = changer.post(CONTROL_URL, data, follow=True)
    assert response.redirect_chain == [(URL, 302)]
    [message] = [str(m) for m in response.context["messages"]]
    assert "not a domain name" in message or "valid choice" in message
    state = control.state(queue)
    assert not state.paused and state.paused_domains == {}


def test_a_render_with_limits_and_switches_runs_no_more_queries(changer, queue, settings):
    """The panel reads Redis only; the page's queries are those of test_dashboard's count."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    changer.get(URL)  # warm up (content types, connections)
    with CaptureQueriesContext(connection) as plain:
        changer.get(URL)
    settings.OUTBOX = {**settings.OUTBOX, "RATE_LIMITS": {"*": "10/s", "a.example": "1/m"}}
    control.pause("a.example", queue=queue)
    control.pause(queue=queue)
    with CaptureQueriesContext(connection) as full:
        html = changer.get(URL).content.decode()
    assert 'data-key="a.example"' in html and 'id="outbox-resume"' in html
    assert len(full) == len(plain), [q["sql"] for q in full.captured_queries]
