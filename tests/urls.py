"""URLs for the test project: the admin (the admin tests and the browser test use it), and the outbox's own URLs (its metrics)."""

from django.contrib import admin
from django.urls import include, path

from tests import views

urlpatterns = [
    path("admin/", admin.site.urls),
    # Django's password reset flow, which tests/backends/test_outbox.py sends through the outbox.
    path("accounts/", include("django.contrib.auth.urls")),
    # The Prometheus metrics (tests/status/test_metrics.py).
    path("outbox/", include("outbox.urls")),
    # anymail's webhooks: the ESP event hook (tests/contrib/test_anymail.py).
    path("anymail/", include("anymail.urls")),
    # A plain enqueue view, loaded by a runserver process (tests/enqueue/test_turns.py).
    path("enqueue/", views.enqueue),
]
