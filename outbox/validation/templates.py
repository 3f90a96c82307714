"""Email templates: the engine they compile with, and their syntax errors with a line."""

from __future__ import annotations

from collections.abc import Mapping

from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.template import Engine, Template, engines
from django.template.backends.django import DjangoTemplates
from django.utils.translation import gettext as _


def template_engine() -> Engine:
    """The project's Django template engine, which email templates compile with."""
    for backend in engines.all():
        if isinstance(backend, DjangoTemplates):
            return backend.engine
    raise ImproperlyConfigured(
        "outbox email templates need a DjangoTemplates engine in settings.TEMPLATES."
    )


def describe_template_error(exc: BaseException, source: str | None = None) -> str:
    """An error with the line it is on, when the template engine can tell."""
    debug = getattr(exc, "template_debug", None)
    if debug is None and source is not None:
        # Compiled without debug: compile again with it, for the line number.
        try:
            Template(source, engine=_debug_engine())
        except Exception as again:
            debug = getattr(again, "template_debug", None)
    if debug:
        return _("line %(line)d: %(error)s") % {"line": debug["line"], "error": exc}
    return str(exc)


def _debug_engine() -> Engine:
    engine = template_engine()
    return Engine(
        debug=True,
        libraries=engine.libraries,
        builtins=[b for b in engine.builtins if b not in Engine.default_builtins],
    )


def check_template_syntax(parts: Mapping[str, str]) -> None:
    """Compile each part ``{field: source}``; raise ``ValidationError`` per field that fails."""
    errors: dict[str, list[str]] = {}
    for field, source in parts.items():
        if not source:
            continue
        try:
            Template(source, engine=_debug_engine())
        except Exception as exc:
            errors[field] = [describe_template_error(exc)]
    if errors:
        raise ValidationError(errors)
