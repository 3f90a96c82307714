"""URLs of the benchmark project: the admin (with the outbox dashboard) and the outbox's metrics."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("outbox/", include("outbox.urls")),
]
