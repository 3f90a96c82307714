"""outbox/compat/: the only uses of what Django, Python's email and anymail keep private.

Each test here fails loudly, naming what changed, on a library version that no
longer does what a module of ``outbox/compat/`` relies on; run in every cell of
tests/run.sh (each Python and Django version the suite runs). The last tests
read ``outbox/`` outside ``compat/`` and fail on a new private use there: an
assignment to ``__class__``, a library method replaced on an instance, or a
private attribute of a library set or read.
"""

from __future__ import annotations

import ast
import email
import email.policy
import inspect
from decimal import Decimal
from email.message import Message
from email.mime.base import MIMEBase
from email.mime.text import MIMEText
from pathlib import Path

import pytest
from django.contrib.admin import AdminSite
from django.core.mail import EmailMessage
from django.db.models.base import ModelState
from django.test import RequestFactory
from django.urls import URLPattern, path

from outbox.compat.django import extend_admin_site, is_extended, mark_saved
from outbox.compat.email import copy_with_own_headers
from outbox.models import Email
from tests.paths import ROOT

PACKAGE = ROOT / "outbox"

# -- compat/email.py ----------------------------------------------------------------


@pytest.mark.parametrize("policy", [email.policy.compat32, email.policy.default])
def test_a_copy_with_its_own_headers_changes_only_its_own(policy):
    original = MIMEText("body", "plain", "utf-8", policy=policy)
    original["Message-ID"] = "<one@example.com>"
    assert isinstance(getattr(original, "_headers", None), list), (
        "email.message.Message no longer keeps its headers in a list named _headers: "
        "outbox/compat/email.py must change"
    )

    duplicate = copy_with_own_headers(original)
    duplicate.replace_header("Message-ID", "<two@example.com>")

    assert original["Message-ID"] == "<one@example.com>"
    assert duplicate["Message-ID"] == "<two@example.com>"
    # The parts are shared, not copied: that is what makes the copy cheap.
    assert duplicate.get_payload() is original.get_payload()
    assert duplicate.as_bytes().endswith(original.as_bytes().split(b"\n\n", 1)[1])


def test_a_shallow_copy_still_shares_the_header_list():
    """Why compat/email.py exists: if this fails, copy.copy alone is enough now."""
    import copy

    original = Message()
    original["Subject"] = "s"
    copy.copy(original).replace_header("Subject", "t")
    assert original["Subject"] == "t"


def test_a_stored_part_parses_into_a_mimebase_without_headers_of_its_own():
    """The public way outbox/mail/structure.py takes for Django 5.2's attach()."""
    from outbox.mail.structure import ParsedMIMEPart

    raw = b"Content-Type: text/plain\r\nX-Part: 1\r\n\r\nhello\r\n"
    part = email.message_from_bytes(raw, _class=ParsedMIMEPart)
    assert isinstance(part, MIMEBase)
    assert part.items() == [("Content-Type", "text/plain"), ("X-Part", "1")]
    assert part.get_payload() == "hello\r\n"


# -- compat/django.py ---------------------------------------------------------------


@pytest.mark.django_db
def test_mark_saved_leaves_an_instance_as_loading_it_would():
    assert all(hasattr(ModelState(), name) for name in ("adding", "db")), (
        "Django's ModelState no longer has adding and db: outbox/compat/django.py must change"
    )
    built = Email(subject="s", body="b", from_email="f@example.com")
    assert built._state.adding is True and built._state.db is None
    built.save()
    loaded = Email.objects.get(pk=built.pk)

    fresh = Email(pk=built.pk, subject="s", body="b", from_email="f@example.com")
    mark_saved(fresh, "default")

    assert (fresh._state.adding, fresh._state.db) == (loaded._state.adding, loaded._state.db)
    # Django acts on it: unique checks treat it as the stored row, not a new one.
    fresh.validate_unique()


def test_extend_admin_site_adds_urls_and_app_list_entries_once():
    for name in ("get_urls", "get_app_list"):
        assert callable(getattr(AdminSite, name, None)), f"AdminSite.{name} is gone"
    assert list(inspect.signature(AdminSite.get_app_list).parameters) == [
        "self",
        "request",
        "app_label",
    ], "AdminSite.get_app_list(request, app_label=None) changed its signature"
    site = AdminSite(name="compat")
    extra = path("extra/", lambda request: None, name="compat_extra")
    seen: list[int] = []

    def entries(request, app_list):
        seen.append(len(app_list))
        return [*app_list, {"app_label": "extra", "models": []}]

    extend_admin_site(site, urls=lambda: [extra], app_list=entries)
    wrapped = site.get_urls
    extend_admin_site(site, urls=lambda: [extra], app_list=entries)

    assert is_extended(site) and site.get_urls is wrapped
    patterns = site.get_urls()
    assert patterns[0] is extra and isinstance(patterns[0], URLPattern)
    request = RequestFactory().get("/admin/")
    request.user = type("Anonymous", (), {"is_active": False, "is_staff": False})()
    assert site.get_app_list(request)[-1]["app_label"] == "extra"
    assert seen == [0]
    assert not is_extended(AdminSite(name="untouched"))


# -- no private use outside compat/ -------------------------------------------------

# Private names of Django, email, smtplib and redis-py the outbox has used, or
# could reach for; read or set outside compat/ they fail the suite.
KNOWN_PRIVATE = {
    "_state",
    "_headers",
    "_get_socket",
    "_partial_connection",
    "_registry",
    "_command_packer",
    "_available_connections",
    "_in_use_connections",
    "_host",
    "_payload",
    "_charset",
}
# Library methods that must not be replaced on an instance (a subclass overrides them).
METHODS = {"send", "data", "getreply", "connect", "get_urls", "get_app_list", "open", "close"}
# Underscore names of the standard library that are public API.
PUBLIC_UNDERSCORE = {"_exit", "_replace", "_asdict", "_fields", "_field_defaults", "_make", "_meta"}


def _outside_compat() -> list[Path]:
    return sorted(
        p for p in PACKAGE.rglob("*.py") if "compat" not in p.relative_to(PACKAGE).parts[:1]
    )


def _own_underscore_names() -> set[str]:
    """Underscore names the outbox itself defines: on ``self``/``cls``, as functions, classes, names."""
    names: set[str] = set()
    for file in _outside_compat():
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
    return names - KNOWN_PRIVATE


def _private_uses(text: str, where: str, own: set[str]) -> list[str]:
    """Each private use in the Python source ``text`` (of file ``where``), as ``where:line: what``."""
    found = []
    tree = ast.parse(text, where)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            stored = isinstance(node.ctx, ast.Store)
            if node.attr == "__class__" and stored:
                found.append(f"{where}:{node.lineno}: assigns __class__")
            elif stored and not on_self and node.attr in METHODS:
                found.append(f"{where}:{node.lineno}: replaces .{node.attr} on an instance")
            elif node.attr in KNOWN_PRIVATE:
                found.append(f"{where}:{node.lineno}: uses the private .{node.attr}")
            elif (
                node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not on_self
                and node.attr not in own | PUBLIC_UNDERSCORE
            ):
                found.append(f"{where}:{node.lineno}: uses .{node.attr}, not the outbox's own")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "getattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            name = node.args[1].value
            if (
                name in KNOWN_PRIVATE
                or name == "__class__"
                or (node.func.id == "setattr" and name in METHODS)
            ):
                found.append(f"{where}:{node.lineno}: {node.func.id}(..., {name!r})")
    return found


def test_no_private_use_of_a_library_outside_compat():
    own = _own_underscore_names()
    found = [
        use
        for file in _outside_compat()
        for use in _private_uses(file.read_text(), str(file.relative_to(ROOT)), own)
    ]
    assert not found, "move it to outbox/compat/ (with a test here), or use a public way:\n" + (
        "\n".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        "backend.__class__ = bounded",
        "obj._state = state",
        "msg._headers = list(built._headers)",
        "setattr(connection, 'send', send)",
        "site.get_urls = get_urls",
        "setattr(connection, '_get_socket', f)",
        "part.__class__ = MIMEBase",
        "pool._available_connections.pop()",
    ],
)
def test_the_check_finds_each_kind_of_private_use(source):
    assert _private_uses(source, "<probe>", own=set()), f"not found: {source}"


def test_the_check_leaves_public_and_own_names_alone():
    source = "self._x = 1\nos._exit(1)\nrow._replace(a=1)\nModel._meta.fields\nobj._mine()\n"
    assert _private_uses(source, "<probe>", own={"_mine"}) == []


def test_anymails_payload_build_checks_a_message_without_a_request(settings):
    """outbox.compat.anymail: build_message_payload and serialize_data, as anymail 15 has them."""
    from anymail.backends.postmark import EmailBackend as Postmark
    from anymail.exceptions import AnymailSerializationError, AnymailUnsupportedFeature

    from outbox.compat.anymail import check_message

    settings.ANYMAIL = {"POSTMARK_SERVER_TOKEN": "tests-only"}
    backend = Postmark()
    fine = EmailMessage("s", "b", "from@example.com", ["to@example.com"])
    check_message(backend, fine)
    two_tags = EmailMessage("s", "b", "from@example.com", ["to@example.com"])
    two_tags.tags = ["a", "b"]  # type: ignore[attr-defined]
    with pytest.raises(AnymailUnsupportedFeature):
        check_message(backend, two_tags)
    not_json = EmailMessage("s", "b", "from@example.com", ["to@example.com"])
    not_json.metadata = {"total": Decimal("1.50")}  # type: ignore[attr-defined]
    with pytest.raises(AnymailSerializationError):
        check_message(backend, not_json)
    assert not hasattr(fine, "anymail_status")  # the caller's message is left as it was
