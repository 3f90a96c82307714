"""Read-only inlines: rows shown under their parent, never added, changed or deleted here."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.http import HttpRequest


def has_model_perm(request: HttpRequest, model: type[Any], actions: Iterable[str]) -> bool:
    opts = model._meta
    return any(
        request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")
        for action in actions
    )


class ReadOnlyInline(admin.TabularInline):
    """An inline that shows rows and never adds, changes or deletes one."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class PartOfParentInline(ReadOnlyInline):
    """Rows that are part of their parent's record and have no admin of their own.

    Whoever may see the parent sees them; no separate permission is needed.
    """

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_model_perm(request, self.parent_model, ("view", "change"))
