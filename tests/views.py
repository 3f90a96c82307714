"""Views of the test project: what a project's own code does with the outbox."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from outbox import enqueue_email


@csrf_exempt
def enqueue(request: HttpRequest) -> HttpResponse:
    """A plain enqueue view, as a sign-up or a password reset would have: one email, 200."""
    [delivery] = enqueue_email("Welcome", "Hello.\n", None, [request.POST["to"]])
    return HttpResponse(str(delivery.pk))
