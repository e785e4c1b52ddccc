"""The example's views: async and sync ones, one with a per-user limit, one
exempt."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from throttlegate.django import ratelimit, ratelimit_exempt


async def index(request: HttpRequest) -> JsonResponse:
    """An async view: every request counts against `per-ip`."""
    return JsonResponse({"hello": "world", "remaining": request.ratelimit.remaining})


def report(request: HttpRequest) -> JsonResponse:
    """A sync view, limited the same way."""
    return JsonResponse({"report": "ready"})


async def login(request: HttpRequest) -> JsonResponse:
    """POST /login also counts against `login` (a rule matching its route)."""
    return JsonResponse({"token": "t_123"})


def _user(request: HttpRequest) -> dict[str, str | None]:
    # A project with django.contrib.auth would use str(request.user.pk).
    return {"user": request.headers.get("X-User")}


@ratelimit(attributes=_user, cost=1)
def export(request: HttpRequest) -> JsonResponse:
    """Also counts against `export-per-user`, keyed on the user."""
    return JsonResponse({"export": "started"})


@ratelimit_exempt
async def health(request: HttpRequest) -> JsonResponse:
    """Never checked."""
    return JsonResponse({"ok": True})
