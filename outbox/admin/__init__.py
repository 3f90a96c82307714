"""The operator's admin: deliveries, templates and suppressions, and the dashboard.

``deliveries`` (the list, the detail and the actions), ``emails`` (what was
enqueued, with its deliveries and attachments), ``content`` (email templates
and suppressions), ``dashboard`` and its ``control_panel`` (pause and
resume), with the small parts they share: ``cells`` (how a value is shown),
``inlines`` and ``paginator``. The default admin site gets the dashboard at
``/admin/outbox/dashboard/``; a project with its own ``AdminSite`` class puts
``outbox.admin.DashboardSiteMixin`` before it, or calls
``outbox.admin.install_dashboard(its_site)``.
"""

from django.contrib import admin

from . import content, deliveries, emails
from .dashboard import DashboardSiteMixin
from .dashboard import install as install_dashboard

install_dashboard(admin.site)

__all__ = ["DashboardSiteMixin", "content", "deliveries", "emails", "install_dashboard"]
