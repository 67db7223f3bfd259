from __future__ import annotations

import datetime as dt

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
    # How the change came, when not through the pages or the CLI: "API token deploy-bot (dlq_3f9a0c1e)".
    via = models.CharField(max_length=128, blank=True, default="")
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


class ApiToken(models.Model):
    """A personal API token: `dlq_<prefix>_<secret>`, shown once when made. Only the prefix (to find the row) and a
    SHA-256 of the whole token are stored; the token is 256 random bits, so a fast hash is enough (no password
    stretching: nothing guessable is hashed). A token acts as its user, with the user's role at each request.
    Revoking keeps the row (the audit log names tokens) and stops it at once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=64)
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # A read-only token reads what its user may read and changes nothing, whatever the user's role.
    read_only = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API token"
        constraints = [
            # One live token of a name per user, so `api_token revoke USER NAME` names one token.
            models.UniqueConstraint(
                fields=["user", "name"], condition=models.Q(revoked_at__isnull=True), name="apitoken_live_name"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix})"

    def state(self, now: dt.datetime | None = None) -> str:
        """'active', 'expired' or 'revoked'."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= (now or timezone.now()):
            return "expired"
        return "active"
