from __future__ import annotations

from django.urls import path

from dlqconsole.deadletters.views import message_detail, message_edit, messages, patterns, triage

app_name = "deadletters"
urlpatterns = [
    path("patterns/", patterns.pattern_list, name="patterns"),
    path("patterns/merge/", triage.pattern_merge, name="pattern-merge"),
    path("patterns/<int:pk>/", patterns.pattern_detail, name="pattern"),
    path("patterns/<int:pk>/status/", triage.pattern_status_change, name="pattern-status"),
    path("patterns/<int:pk>/assign/", triage.pattern_assign, name="pattern-assign"),
    path("patterns/<int:pk>/split/", triage.pattern_split, name="pattern-split"),
    path("messages/", messages.message_list, name="messages"),
    path("messages/export/", messages.message_export, name="export"),
    path("messages/exports/<str:name>/", messages.export_status, name="export-status"),
    path("messages/<int:pk>/", message_detail.message_detail, name="message"),
    path("messages/<int:pk>/body/", message_detail.message_body, name="message-body"),
    path("messages/<int:pk>/edit/", message_edit.message_edit, name="message-edit"),
]
