"""Which mail is sensitive: its content is cleared as soon as it is settled.

A caller says so (``enqueue_email(..., sensitive=True)``, or
``message.outbox_sensitive = True`` on a message for the drop-in backend), or
the site names, once, the pages whose links make a message sensitive:
``OUTBOX["SENSITIVE_LINKS"] = ["password_reset_confirm"]`` catches the mail of
Django's password-reset view, whose template and context the backend never
sees, only the link it wrote. A link is an absolute ``http(s)`` URL in the
text or the HTML; its path is resolved as Django resolves a request's (the
script prefix removed), its host ignored, and it counts if its URL name, or
``namespace:name``, is listed. Nothing is read while the setting is empty.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

from django.urls import Resolver404, get_script_prefix, resolve

from ..conf import outbox_settings

_LINK = re.compile(r"""https?://[^\s"'<>()\[\]]+""", re.IGNORECASE)


def links_sensitive(*texts: str) -> bool:
    """Whether any of ``texts`` links to a page named in ``OUTBOX["SENSITIVE_LINKS"]``."""
    names = set(outbox_settings.SENSITIVE_LINKS)
    if not names:
        return False
    seen: set[str] = set()
    for text in texts:
        for link in _LINK.findall(text or ""):
            path = _path(link)
            if path is None or path in seen:
                continue
            seen.add(path)
            if _names(path) & names:
                return True
    return False


def _path(link: str) -> str | None:
    try:
        path = unquote(urlsplit(link.replace("&amp;", "&")).path) or "/"
    except ValueError:  # a malformed link (an unclosed IPv6 bracket) is no page of ours
        return None
    prefix = get_script_prefix()
    if prefix != "/" and path.startswith(prefix):
        path = "/" + path[len(prefix) :]
    return path


def _names(path: str) -> set[str]:
    try:
        match = resolve(path)
    except Resolver404:
        return set()
    return {name for name in (match.url_name, match.view_name) if name}
