"""Email templates: find one, compile it once, render it per recipient.

A template is found, for ``(name, language)``, in this order:

1. an :class:`~outbox.models.EmailTemplate` row for ``(name, language)``;
2. a row for ``(name, "")`` (blank: the default), then ``(name, LANGUAGE_CODE)``;
3. Django template files ``<name>/<language>/<part>`` or else ``<name>/<part>``,
   part by part, for ``subject.txt``, ``body.txt`` and ``body.html``, found by
   the loaders of the project's first ``DjangoTemplates`` engine.

A template needs a subject and a text or an HTML body. ``language=None``
means ``settings.LANGUAGE_CODE``.

Rendering rules, for every source: the subject is rendered without
autoescape, and every run of whitespace in it (line breaks included) is
collapsed to one space, so a subject written over several lines, or a
context value holding a line break, still comes out as one header line. The
text body is rendered without autoescape and the HTML body with it. All parts
are rendered with the language activated (``translation.override``).

Every failure (no template, a syntax error, an error while rendering) raises
``ValidationError`` naming the template and the part, before anything is
written. Each template is compiled once per enqueue call, whatever the number
of recipients.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.template import Context, Template, TemplateDoesNotExist
from django.utils import translation
from django.utils.translation import gettext as _

from .models import EmailTemplate
from .validation import describe_template_error, template_engine

__all__ = ["CompiledTemplate", "TemplateCache", "render"]

# (file name, model field) of each part.
PARTS = (("subject.txt", "subject"), ("body.txt", "text"), ("body.html", "html"))


@dataclass(frozen=True)
class CompiledTemplate:
    """The compiled parts of one template, and where they came from (for errors)."""

    name: str
    language: str
    origin: str
    subject: Template
    text: Template | None
    html: Template | None


def template_error(name: str, part: str, message: str) -> ValidationError:
    """The error of one template part, naming both."""
    return ValidationError(
        {
            "template": [
                ValidationError(
                    _("Template %(name)s, %(part)s: %(message)s")
                    % {"name": name, "part": part, "message": message},
                    code="template",
                )
            ]
        }
    )


def compile_source(name: str, part: str, source: str) -> Template:
    """Compile one part's source, or raise ``ValidationError`` with the line."""
    try:
        return Template(source, engine=template_engine())
    except Exception as exc:
        raise template_error(name, part, describe_template_error(exc, source)) from exc


class TemplateCache:
    """The templates of one enqueue call, each looked up and compiled once."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using
        self._found: dict[tuple[str, str], CompiledTemplate] = {}

    def get(self, name: Any, language: Any) -> CompiledTemplate:
        if not isinstance(name, str) or not name.strip():
            raise ValidationError({"template": [_("A template name is required.")]})
        if language is not None and not isinstance(language, str):
            raise TypeError(f"language must be a string, not {type(language).__name__}")
        lang = language or settings.LANGUAGE_CODE
        key = (name, lang)
        if key not in self._found:
            self._found[key] = self._database(name, lang) or self._files(name, lang)
        return self._found[key]

    def _database(self, name: str, lang: str) -> CompiledTemplate | None:
        wanted = [lang, "", settings.LANGUAGE_CODE]
        manager = EmailTemplate.objects
        rows = manager.using(self.using) if self.using else manager.all()
        found = {t.language: t for t in rows.filter(name=name, language__in=wanted)}
        row = next((found[w] for w in wanted if w in found), None)
        if row is None:
            return None
        return compile_row(row, lang)

    def _files(self, name: str, lang: str) -> CompiledTemplate:
        engine = template_engine()
        parts: dict[str, Template | None] = {}
        for file, field in PARTS:
            candidates = [f"{name}/{lang}/{file}", f"{name}/{file}"]
            try:
                parts[field] = engine.select_template(candidates)
            except TemplateDoesNotExist:
                parts[field] = None
            except Exception as exc:
                raise template_error(name, file, describe_template_error(exc)) from exc
        subject = parts["subject"]
        if subject is None:
            raise template_error(
                name,
                "subject",
                _("no database template and no file %(file)s.") % {"file": f"{name}/subject.txt"},
            )
        if parts["text"] is None and parts["html"] is None:
            raise template_error(
                name, "body", _("neither %(name)s/body.txt nor body.html exists.") % {"name": name}
            )
        return CompiledTemplate(name, lang, "files", subject, parts["text"], parts["html"])


def compile_row(row: EmailTemplate, language: str | None = None) -> CompiledTemplate:
    """Compile an :class:`EmailTemplate` row, to render in ``language`` (default: its own)."""
    label = str(row)
    if not row.subject.strip():
        raise template_error(label, "subject", _("the subject is empty."))
    if not row.text and not row.html:
        raise template_error(label, "text", _("the template has neither text nor HTML."))
    parts = {
        field: compile_source(label, field, getattr(row, field)) if getattr(row, field) else None
        for _file, field in PARTS
    }
    subject = parts["subject"]
    assert subject is not None
    lang = language or row.language or settings.LANGUAGE_CODE
    origin = f"database row {row.pk}"
    return CompiledTemplate(row.name, lang, origin, subject, parts["text"], parts["html"])


def render(template: CompiledTemplate, context: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """``(subject, text, html or None)`` for one recipient's context."""
    if not isinstance(context, Mapping):
        raise TypeError(f"context must be a dict, not {type(context).__name__}")
    # One Context for the three parts (a copy: tags like {% url ... as x %}
    # write into it), its autoescape switched per part.
    shared = Context(dict(context), autoescape=False)
    # Activating a language costs more than some renders: skip it when that
    # language is already the active one (10,000 renders in one call).
    language = template.language
    active = translation.get_language() == language
    with contextlib.nullcontext() if active else translation.override(language):
        subject = _render(template, "subject", template.subject, shared, autoescape=False)
        text = (
            _render(template, "text", template.text, shared, autoescape=False)
            if template.text is not None
            else ""
        )
        html = (
            _render(template, "html", template.html, shared, autoescape=True)
            if template.html is not None
            else None
        )
    return " ".join(subject.split()), text, html


def _render(
    template: CompiledTemplate, part: str, compiled: Template, context: Context, *, autoescape: bool
) -> str:
    context.autoescape = autoescape
    try:
        return compiled.render(context)
    except Exception as exc:
        label = f"{template.name} [{template.language}] ({template.origin})"
        raise template_error(label, part, describe_template_error(exc)) from exc
