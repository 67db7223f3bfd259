from __future__ import annotations

from django.urls import path

from dlqconsole.deadletters import views

app_name = "deadletters"
urlpatterns = [
    path("patterns/", views.pattern_list, name="patterns"),
    path("patterns/merge/", views.pattern_merge, name="pattern-merge"),
    path("patterns/<int:pk>/", views.pattern_detail, name="pattern"),
    path("patterns/<int:pk>/status/", views.pattern_status_change, name="pattern-status"),
    path("patterns/<int:pk>/assign/", views.pattern_assign, name="pattern-assign"),
    path("patterns/<int:pk>/split/", views.pattern_split, name="pattern-split"),
    path("messages/", views.message_list, name="messages"),
    path("messages/export/", views.message_export, name="export"),
    path("messages/exports/<str:name>/", views.export_status, name="export-status"),
    path("messages/<int:pk>/", views.message_detail, name="message"),
    path("messages/<int:pk>/body/", views.message_body, name="message-body"),
    path("messages/<int:pk>/edit/", views.message_edit, name="message-edit"),
]
