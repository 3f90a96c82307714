"""The admin in a real browser: an operator settles abandoned deliveries.

Headless Chromium driven by Selenium against a live server: log in, open the delivery list, filter to abandoned, tick a few rows, run
"Mark as sent (confirmed in the mail logs)" and read the message. In a
1,366 x 900 window with Django's app list open, and at 1,920 px, the list does not
scroll sideways and every column header shows. The
operator also opens the dashboard from the admin index, reads its counts, follows
its link to the abandoned rows, and pauses and resumes sending with its buttons. Screenshots of the list, of one delivery and of the
dashboard go to ``tests/artifacts/``; with
``OUTBOX_UPDATE_SCREENSHOTS=1`` they are also copied to ``example_project/screenshots/``
(the README shows them).

Uses Debian's ``chromium`` and ``chromium-driver`` (tests/run.sh installs
them); Selenium is given the driver's path, so it never downloads one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import django.contrib.admin
import pytest
from django.test.utils import override_settings
from django.urls import reverse
from django.utils import timezone
from pytest_django.live_server_helper import LiveServer
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

from outbox import enqueue_email
from outbox.admin.cells import SUBJECT_CHARS
from outbox.models import Attempt, Delivery
from outbox.queue import RedisQueue, control, ratelimit
from tests.cells import only_in_cells
from tests.paths import ROOT

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    only_in_cells("6.1:postgres", why="the browser sees the same pages in every cell"),
]

ARTIFACTS = ROOT / "tests" / "artifacts"
DOCS_IMAGES = ROOT / "example_project" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WORKER = "mailhost:4242:worker-1"
USERNAME = "operator"
PASSWORD = "correct horse battery staple"
MARK_SENT = "Mark as sent (confirmed in the mail logs)"
# A common laptop screen: with Django's app list open beside it, the narrowest
# window the delivery list is laid out for.
LAPTOP = (1366, 900)
WIDE = (1920, 1080)
# Longer than the list shows (SUBJECT_CHARS): the list cuts it, the tooltip has it all.
SUBJECT = "Your order #10432 has shipped: tracking number, delivery window and how to return it"


def _skip_reason() -> str | None:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        return f"no browser to run: {', '.join(missing)} missing (apt-get install chromium chromium-driver)"
    return None


@pytest.fixture
def admin_live_server(transactional_db) -> Iterator[LiveServer]:
    """pytest-django's live server, for this test only, serving the admin's CSS and JS.

    The ``live_server`` fixture itself cannot be used with tests/settings.py:
    without STATIC_URL, its static-files handler fails every request
    (``TypeError: startswith first arg must be str ... not bytes``). Here the
    same server starts with STATIC_URL set and STATIC_ROOT pointing at the
    admin's own static files, so the pages look as they do in production.
    """
    static_root = Path(django.contrib.admin.__file__).resolve().parent / "static"
    with override_settings(STATIC_URL="/static/", STATIC_ROOT=str(static_root)):
        server = LiveServer("localhost")
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    profile = tempfile.mkdtemp(prefix="outbox-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-proxy-server",
        f"--user-data-dir={profile}",
        f"--window-size={LAPTOP[0]},{LAPTOP[1]}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(driver: WebDriver, timeout: float = 30) -> WebDriverWait:
    return WebDriverWait(driver, timeout)


def click_and_load(driver: WebDriver, element) -> None:
    """Click something that loads a new page, and wait until it has."""
    old_page = driver.find_element(By.TAG_NAME, "html")
    element.click()

    def left(_driver: WebDriver) -> bool:
        # Chromium may answer "node does not belong to the document" instead of
        # "stale element" while the old page goes away: either way, it is gone.
        try:
            old_page.is_enabled()
        except WebDriverException:
            return True
        return False

    wait(driver).until(left)
    wait(driver).until(lambda d: d.execute_script("return document.readyState") == "complete")


def screenshot(driver: WebDriver, name: str, docs_name: str) -> Path:
    """Save the whole page (not just the window) to tests/artifacts/, and to example_project/screenshots/ if asked."""
    width, height = driver.get_window_size()["width"], driver.get_window_size()["height"]
    page_height = driver.execute_script(
        "return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)"
    )
    driver.set_window_size(width, max(height, page_height + 150))
    try:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / name
        assert driver.save_screenshot(str(path)), f"could not save {path}"
    finally:
        driver.set_window_size(width, height)
    if os.environ.get("OUTBOX_UPDATE_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS_IMAGES / docs_name)
    return path


def resize(driver: WebDriver, width: int, height: int) -> None:
    """Resize the window, and wait until the page has its new width."""
    driver.set_window_size(width, height)
    wait(driver).until(lambda d: d.execute_script("return window.innerWidth") == width)


def list_layout(driver: WebDriver) -> dict:
    """Where the delivery list sits in the page, in CSS pixels (what the assertions read)."""
    return driver.execute_script(
        """
        const doc = document.documentElement;
        const content = document.getElementById('content');
        const results = document.querySelector('#changelist .results');
        const table = document.getElementById('result_list');
        const filter = document.getElementById('changelist-filter');
        const nav = document.getElementById('nav-sidebar');
        const rows = [...table.querySelectorAll('tbody tr')];
        const heights = () => rows.map(r => r.getBoundingClientRect().height);
        const before = heights();
        table.style.whiteSpace = 'nowrap';  // what each row would be on one line
        const oneLine = heights();
        table.style.whiteSpace = '';
        const edges = el => {
            const r = el.getBoundingClientRect();
            return [Math.round(r.left), Math.round(r.right)];
        };
        const padding = parseFloat(getComputedStyle(content).paddingRight);
        const inside = edges(results);
        return {
            viewport: window.innerWidth,
            page: [doc.scrollWidth, doc.clientWidth],
            sidebar: {
                open: document.getElementById('main').classList.contains('shifted'),
                expanded: nav.getAttribute('aria-expanded'),
                edges: edges(nav),
                visible: getComputedStyle(nav).visibility,
            },
            content: [Math.round(content.getBoundingClientRect().left),
                      Math.round(content.getBoundingClientRect().right - padding)],
            filter: filter ? edges(filter) : null,
            results: [results.scrollWidth, results.clientWidth],
            table: edges(table),
            wrapped: before.filter((h, i) => h > oneLine[i] + 0.5).length,
            rows: rows.length,
            columns: [...table.querySelectorAll('thead th')].map(th => {
                const [left, right] = edges(th);
                const r = th.getBoundingClientRect();
                const hit = document.elementFromPoint(
                    (r.left + r.right) / 2, (r.top + r.bottom) / 2);
                const label = th.querySelector('.text') || th;
                return {
                    name: th.className.split(' ').filter(c => c.startsWith('column-')
                        || c === 'action-checkbox-column').join(' '),
                    text: th.innerText.trim(),
                    edges: [left, right],
                    shown: left >= inside[0] - 1 && right <= inside[1] + 1
                        && right <= window.innerWidth && th.contains(hit),
                    clipped: label.scrollWidth > label.clientWidth + 1,
                };
            }),
        };
        """
    )


def assert_list_fits(driver: WebDriver, width: int) -> None:
    """The delivery list fits the window beside the open app list: no sideways scrolling, no wrapped line."""
    layout = list_layout(driver)
    assert layout["viewport"] == width, layout
    assert layout["sidebar"]["open"] and layout["sidebar"]["expanded"] == "true", layout
    assert layout["sidebar"]["visible"] == "visible" and layout["sidebar"]["edges"][1] > 200, layout
    assert layout["rows"] > 0, layout
    assert layout["page"][0] <= layout["page"][1], f"the page scrolls sideways: {layout}"
    assert layout["results"][0] <= layout["results"][1], f"the list scrolls sideways: {layout}"
    assert layout["table"][1] <= layout["content"][1], f"the list overflows the content: {layout}"
    if layout["filter"]:
        assert layout["table"][1] <= layout["filter"][0], (
            f"the list runs under the filters: {layout}"
        )
    hidden = [c for c in layout["columns"] if not c["shown"] or c["clipped"]]
    assert not hidden, f"column headers hidden or cut: {hidden}; {layout}"
    assert layout["wrapped"] == 0, f"rows wrap: {layout}"


def assert_cells_are_compact(driver: WebDriver) -> None:
    # The subject, under the recipient, is cut, and whole in its tooltip.
    cell = driver.find_element(
        By.CSS_SELECTOR, "#result_list .field-recipient_display .outbox-subject"
    )
    assert cell.text.endswith("\u2026") and len(cell.text) == SUBJECT_CHARS
    assert cell.get_attribute("title") == SUBJECT
    # Dates are short, the full time is in their tooltip.
    stamp = driver.find_element(By.CSS_SELECTOR, "#result_list td.field-updated_display time")
    assert len(stamp.text) <= 12 and stamp.get_attribute("title").endswith("UTC")


def make_deliveries() -> list[int]:
    """3,000 queued deliveries of one email; 20 of them abandoned. Returns those 20, newest first."""
    recipients = [f"customer{i:04d}@example.com" for i in range(3000)]
    deliveries = enqueue_email(SUBJECT, "It is on its way.", "shop@example.com", recipients)
    assert len(deliveries) == 3000
    abandoned = sorted((d.pk for d in deliveries[::150]), reverse=True)
    assert len(abandoned) == 20
    now = timezone.now()
    Delivery.objects.filter(pk__in=abandoned).update(
        status=Delivery.Status.ABANDONED,
        attempts=1,
        worker_id=WORKER,
        claim_token=uuid.uuid4(),
        processing_started_at=now - timedelta(minutes=7),
        last_error="worker went away",
        updated_at=now,
    )
    return abandoned


def test_operator_marks_abandoned_deliveries_sent(admin_live_server, django_user_model, browser):
    live_server = admin_live_server
    django_user_model.objects.create_superuser(USERNAME, "operator@example.com", PASSWORD)
    abandoned = make_deliveries()
    driver = browser
    changelist = reverse("admin:outbox_delivery_changelist")

    # Log in; the admin sends us on to the delivery list.
    driver.get(f"{live_server.url}{reverse('admin:login')}?next={changelist}")
    wait(driver).until(EC.presence_of_element_located((By.ID, "id_username")))
    driver.find_element(By.ID, "id_username").send_keys(USERNAME)
    driver.find_element(By.ID, "id_password").send_keys(PASSWORD)
    click_and_load(driver, driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]"))
    wait(driver).until(EC.presence_of_element_located((By.ID, "result_list")))
    assert driver.current_url.endswith(changelist)
    assert len(driver.find_elements(By.CSS_SELECTOR, "#result_list input.action-select")) == 100

    # Filter to abandoned by the filter link in the sidebar.
    link = driver.find_element(
        By.CSS_SELECTOR, "#changelist-filter a[href*='status__exact=abandoned']"
    )
    click_and_load(driver, link)
    assert "status__exact=abandoned" in driver.current_url
    boxes = driver.find_elements(By.CSS_SELECTOR, "#result_list input.action-select")
    assert [int(box.get_attribute("value")) for box in boxes] == abandoned
    badges = driver.find_elements(By.CSS_SELECTOR, "#result_list .outbox-status")
    assert {badge.text for badge in badges} == {"abandoned"}

    # Tick three rows and choose the action.
    chosen = [abandoned[0], abandoned[2], abandoned[5]]
    for pk in chosen:
        driver.find_element(
            By.CSS_SELECTOR, f"#result_list input.action-select[value='{pk}']"
        ).click()
    wait(driver).until(
        EC.text_to_be_present_in_element((By.CSS_SELECTOR, ".action-counter"), "3 of 20 selected")
    )
    Select(driver.find_element(By.CSS_SELECTOR, "select[name=action]")).select_by_visible_text(
        MARK_SENT
    )
    # Every column shows on a laptop screen with the app list open (as the
    # admin opens it), and on a wide screen.
    assert_list_fits(driver, LAPTOP[0])
    assert_cells_are_compact(driver)
    screenshot(driver, "admin-deliveries.png", "admin-deliveries.png")
    resize(driver, *WIDE)
    assert_list_fits(driver, WIDE[0])
    resize(driver, *LAPTOP)

    click_and_load(driver, driver.find_element(By.CSS_SELECTOR, "button[name=index]"))
    message = wait(driver).until(
        EC.visibility_of_element_located((By.CSS_SELECTOR, ".messagelist li"))
    )
    assert message.text == "Marked 3 deliveries as sent."
    assert "success" in message.get_attribute("class").split()

    # Exactly those rows are sent, each with the operator's decision on record.
    statuses = dict(Delivery.objects.filter(pk__in=abandoned).values_list("pk", "status"))
    assert {pk for pk, status in statuses.items() if status == "sent"} == set(chosen)
    assert {statuses[pk] for pk in abandoned if pk not in chosen} == {"abandoned"}
    assert Delivery.objects.filter(status="sent").count() == 3
    decisions = Attempt.objects.filter(actor=f"admin:{USERNAME}")
    assert sorted(decisions.values_list("delivery_id", flat=True)) == sorted(chosen)
    assert set(decisions.values_list("outcome", flat=True)) == {Attempt.Outcome.MARKED_SENT}
    # The filtered list no longer shows them.
    remaining = driver.find_elements(By.CSS_SELECTOR, "#result_list input.action-select")
    assert [int(box.get_attribute("value")) for box in remaining] == [
        pk for pk in abandoned if pk not in chosen
    ]

    # One delivery's page shows its status and the operator's decision.
    driver.get(live_server.url + reverse("admin:outbox_delivery_change", args=[chosen[0]]))
    wait(driver).until(EC.presence_of_element_located((By.ID, "content-main")))
    page = driver.find_element(By.ID, "content-main").text
    assert "customer" in page and "@example.com" in page
    assert f"admin:{USERNAME}" in page
    assert "marked sent" in page
    assert driver.find_element(By.CSS_SELECTOR, "#content-main .outbox-status").text == "sent"
    screenshot(driver, "admin-delivery-detail.png", "admin-delivery-detail.png")


def make_every_status() -> dict[str, int]:
    """Deliveries in every status (some sent and failed in the last minutes); their counts."""
    counts = {"queued": 6, "processing": 2, "sent": 9, "failed": 3, "abandoned": 4, "cancelled": 1}
    recipients = [f"{s}{i}@example.com" for s, n in counts.items() for i in range(n)]
    deliveries = enqueue_email(SUBJECT, "It is on its way.", "shop@example.com", recipients)
    now = timezone.now()
    position = 0
    for status, n in counts.items():
        for i, delivery in enumerate(deliveries[position : position + n]):
            when = now - timedelta(minutes=2 + 7 * i)
            Delivery.objects.filter(pk=delivery.pk).update(
                status=status,
                sent_at=when if status == "sent" else None,
                updated_at=when,
                worker_id=WORKER if status in ("processing", "abandoned") else "",
            )
        position += n
    # Redis as the workers would have left it: only the queued rows wait in it.
    queue = RedisQueue()
    for delivery in deliveries:
        if not delivery.recipient.startswith("queued"):
            queue.redis.lrem(queue.ready_key("normal"), 0, delivery.pk)
    return counts


def register_live_worker(held: list[int]) -> None:
    """A worker that has just sent its heartbeat and holds ``held``."""
    queue = RedisQueue()
    queue.redis.zadd(queue.workers_key, {WORKER: queue.time()})
    queue.redis.rpush(queue.processing_key(WORKER), *held)


def test_operator_reads_the_dashboard(admin_live_server, django_user_model, browser, settings):
    live_server = admin_live_server
    django_user_model.objects.create_superuser(USERNAME, "operator@example.com", PASSWORD)
    counts = make_every_status()
    driver = browser
    # Sending control as a running worker leaves it, with two limits, one of them in use.
    settings.OUTBOX = {**settings.OUTBOX, "RATE_LIMITS": {"*": "14/s", "gmail.com": "20/m"}}
    control.resume()
    ratelimit.take(RedisQueue(), 1, ratelimit.applicable("gmail.com", ratelimit.limits()))

    # Log in to the index; the outbox section links to the dashboard.
    driver.get(f"{live_server.url}{reverse('admin:login')}?next={reverse('admin:index')}")
    wait(driver).until(EC.presence_of_element_located((By.ID, "id_username")))
    driver.find_element(By.ID, "id_username").send_keys(USERNAME)
    driver.find_element(By.ID, "id_password").send_keys(PASSWORD)
    click_and_load(driver, driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]"))
    link = driver.find_element(By.CSS_SELECTOR, "#content-main .app-outbox tr.model-dashboard a")
    register_live_worker(
        list(Delivery.objects.filter(status="processing").values_list("pk", flat=True))
    )
    click_and_load(driver, link)
    assert driver.current_url.endswith(reverse("admin:outbox_dashboard"))

    for status, n in counts.items():
        assert driver.find_element(By.ID, f"outbox-count-{status}").text == str(n)
    assert driver.find_element(By.ID, "outbox-due").text == "6"
    assert driver.find_element(By.ID, "outbox-workers-live").text == "1 live worker"
    bars = driver.find_elements(By.CSS_SELECTOR, "svg.outbox-chart rect.bar")
    assert sum(int(b.get_attribute("data-count")) for b in bars) == 12  # 9 sent, 3 failed
    assert "Deliveries per minute" in driver.find_element(
        By.ID, "outbox-chart-title"
    ).get_attribute("textContent")
    abandoned = driver.find_element(By.ID, "outbox-abandoned-link")
    assert abandoned.text == "4"
    screenshot(driver, "admin-dashboard.png", "admin-dashboard.png")

    # The abandoned count leads to the filtered list.
    click_and_load(driver, abandoned)
    assert "status__exact=abandoned" in driver.current_url
    badges = driver.find_elements(By.CSS_SELECTOR, "#result_list .outbox-status")
    assert [badge.text for badge in badges] == ["abandoned"] * 4

    # The operator pauses all sending from the dashboard, and resumes it.
    driver.get(live_server.url + reverse("admin:outbox_dashboard"))
    state = driver.find_element(By.ID, "outbox-control-state")
    assert state.get_attribute("data-state") == "running"
    click_and_load(driver, driver.find_element(By.ID, "outbox-pause"))
    message = driver.find_element(By.CSS_SELECTOR, ".messagelist li.success")
    assert message.text == "Sending paused. Messages already being handed over finish."
    assert driver.find_element(By.ID, "outbox-control-state").get_attribute("data-state") == (
        "paused"
    )
    assert control.state().paused
    click_and_load(driver, driver.find_element(By.ID, "outbox-resume"))
    assert driver.find_element(By.CSS_SELECTOR, ".messagelist li.success").text == (
        "Sending resumed."
    )
    assert not control.state().paused
