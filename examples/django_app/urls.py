"""The example's routes."""

from django.urls import path

from django_app import views

urlpatterns = [
    path("", views.index, name="index"),
    path("report", views.report, name="report"),
    path("login", views.login, name="login"),
    path("export", views.export, name="export"),
    path("health", views.health, name="health"),
]
