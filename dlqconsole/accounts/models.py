from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class AuditEntry(models.Model):
    """Who did what, when, with which filter, on how many messages. One row per operation or change."""

    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    # Kept as text too, so the log still names the person after the account is deleted.
    actor_name = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=64)
    # What the action was about, e.g. "operation:12", "pattern:3", "deadletter:981".
    target = models.CharField(max_length=255, blank=True)
    filter = models.JSONField(default=dict, blank=True)
    count = models.BigIntegerField(null=True, blank=True)
    detail = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [
            # Audit page, newest first.
            models.Index(fields=["-created_at"], name="audit_created"),
            # The audit of one target (an operation's or a pattern's "audit log" link, a purge's record), newest first.
            models.Index(fields=["target", "-created_at"], name="audit_target_created"),
            # On PostgreSQL also a GIN index on `filter` (migration 0003): the operations whose filter named a pattern.
        ]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M} {self.actor_name or 'system'} {self.action} {self.target}"
