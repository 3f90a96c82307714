"""The app config: registers the system checks (``outbox/checks/``) and the ESP event hook when Django starts."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = _("Email outbox")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .contrib.anymail import connect

        connect()  # django-anymail's tracking signal, when it is installed
