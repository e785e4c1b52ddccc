"""A Django project rate-limited by throttlegate (see serve.py)."""
