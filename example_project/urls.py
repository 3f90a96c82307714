"""The example project's URLs: the admin, where deliveries can be watched and settled."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
