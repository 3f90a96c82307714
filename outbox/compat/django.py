"""Django: marking an instance saved that the outbox's own SQL inserted; views added to a site.

``enqueue_email`` inserts its email and deliveries in one statement (one
round trip) and hands back the ``Email`` instance it built, as ``save()``
would have left it. ``Model._state`` (``adding``, ``db``) is what ``save()``
sets for that; Django documents it ("Model instance reference", the
``_state`` attribute) but names it as private. The public way, loading the
row again (``Model.from_db``), would build a second instance of an object
the caller may already hold.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import Model


def mark_saved(instance: Model, using: str) -> None:
    """Make ``instance`` look as ``save()`` leaves it: in database ``using``, no longer adding."""
    instance._state.adding = False
    instance._state.db = using


# -- views added to an AdminSite instance -------------------------------------------
#
# The dashboard lives at /admin/outbox/dashboard/ of the project's default
# admin site. An AdminSite subclass adds views by overriding get_urls() and
# get_app_list() (outbox.admin.DashboardSiteMixin does), but the default site,
# django.contrib.admin.site, is made by Django's AdminConfig from a class the
# project chooses (AdminConfig.default_site), not the outbox: Django has no
# public way for an app to add a view to a site instance it did not create.
# So, for that instance only, its two methods are wrapped on the instance.

# Marks a site whose methods extend_admin_site() already wrapped.
_EXTENDED = "_outbox_dashboard_installed"


def extend_admin_site(
    site: Any,
    urls: Callable[[], list[Any]],
    app_list: Callable[[Any, list[dict[str, Any]]], list[dict[str, Any]]],
) -> None:
    """Put ``urls()`` before ``site``'s URLs and pass its app list through ``app_list``.

    ``app_list(request, entries)`` returns the entries to show. Changes this
    instance only; calling it again on the same site changes nothing.
    """
    if getattr(site, _EXTENDED, False):
        return
    original_urls: Callable[[], list[Any]] = site.get_urls
    original_app_list: Callable[..., list[dict[str, Any]]] = site.get_app_list

    def get_urls() -> list[Any]:
        return [*urls(), *original_urls()]

    def get_app_list(request: Any, app_label: str | None = None) -> list[dict[str, Any]]:
        return app_list(request, original_app_list(request, app_label))

    site.get_urls = get_urls
    site.get_app_list = get_app_list
    setattr(site, _EXTENDED, True)


def is_extended(site: Any) -> bool:
    """Whether :func:`extend_admin_site` wrapped ``site``'s methods."""
    return bool(getattr(site, _EXTENDED, False))
