"""Settings of the example project. The limiter's backend and the trusted
proxies come from the environment (serve.py sets them from its arguments)."""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent

SECRET_KEY = "example-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "django_app.urls"
INSTALLED_APPS: list[str] = []
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True

MIDDLEWARE = [
    "django.middleware.common.CommonMiddleware",
    # After AuthenticationMiddleware in a project with users, so that an
    # attributes function can read request.user (await request.auser()).
    "throttlegate.django.RateLimitMiddleware",
]

THROTTLEGATE = {
    "policy": BASE_DIR / "rules.toml",
    "url": os.environ.get("THROTTLEGATE_URL") or None,
    "prefix": os.environ.get("THROTTLEGATE_PREFIX") or None,
    "timeout": float(os.environ.get("THROTTLEGATE_TIMEOUT", "0.1")),
    "on_backend_error": os.environ.get("THROTTLEGATE_ON_BACKEND_ERROR", "allow"),
    "trusted_proxies": [p for p in os.environ.get("THROTTLEGATE_TRUSTED_PROXIES", "").split(",") if p],
}

LOGGING = {"version": 1, "disable_existing_loggers": True}
