"""The outbox's own URLs: ``path("outbox/", include("outbox.urls"))``.

``metrics`` (``reverse("outbox:metrics")``) serves the Prometheus metrics of
:mod:`outbox.status.metrics`, to a scraper with ``OUTBOX["METRICS_TOKEN"]`` only.
"""

from django.urls import path

from .status.metrics import metrics_view

app_name = "outbox"

urlpatterns = [
    path("metrics", metrics_view, name="metrics"),
]
