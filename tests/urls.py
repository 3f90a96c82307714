"""URLs for the test project: the admin (the admin tests and the browser test use it), and the outbox's own URLs (its metrics)."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # Django's password reset flow, which tests/test_backend.py sends through the outbox.
    path("accounts/", include("django.contrib.auth.urls")),
    # The Prometheus metrics (tests/test_metrics.py).
    path("outbox/", include("outbox.urls")),
    # anymail's webhooks: the ESP event hook (tests/test_esp_events.py).
    path("anymail/", include("anymail.urls")),
]
