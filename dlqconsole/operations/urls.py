from __future__ import annotations

from django.urls import path

from dlqconsole.operations import views

app_name = "operations"
urlpatterns = [
    path("", views.operations_list, name="list"),
]
