"""A broker is one AMQP endpoint including its virtual host: two vhosts of one cluster are two brokers.

Queues, dead letters, queue samples, operations and alert scopes belong to one broker; patterns are global. The
broker `default` is AMQP_URL; those named in DLQ_BROKERS are managed by the environment (read-only in the admin,
their credentials never stored); others are added in the admin, their credentials stored encrypted with
DLQ_CREDENTIALS_KEY (secrets.py). Pages, logs and audit rows only ever see `url`, the AMQP URL without its
password."""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models

DEFAULT = "default"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
NAME_HELP = "Letters, digits, dot, dash and underscore, at most 64 (shown on every page; used in --broker NAME)."


class BrokerQuerySet(models.QuerySet["Broker"]):
    def enabled(self) -> BrokerQuerySet:
        return self.filter(enabled=True)


class Broker(models.Model):
    name = models.CharField(
        max_length=64, unique=True, validators=[RegexValidator(NAME_PATTERN, NAME_HELP)], help_text=NAME_HELP
    )
    # The AMQP URL with the password left out: what pages, logs and audit rows show.
    url = models.CharField("AMQP URL", max_length=1000)
    # The whole AMQP URL, password included, encrypted (empty for a broker the environment manages).
    url_secret = models.TextField(blank=True, editable=False)
    # RabbitMQ's management API, asked when planning: empty derives it from the AMQP URL (port 15672), "off" skips.
    api_url = models.CharField("management API URL", max_length=1000, blank=True)
    api_secret = models.TextField(blank=True, editable=False)
    # TLS for amqps:// URLs: the CA certificate (PEM) that signed the broker's, empty for the system's CAs.
    tls_ca_certificate = models.TextField("TLS CA certificate", blank=True)
    tls_verify = models.BooleanField("verify TLS certificates", default=True)
    managed = models.BooleanField(default=False, editable=False, help_text="From AMQP_URL or DLQ_BROKERS.")
    enabled = models.BooleanField(default=True, help_text="Disabled brokers are not consumed, sampled or replayed to.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = BrokerQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_default(self) -> bool:
        return self.name == DEFAULT


_default_id: int | None = None


def default_broker_id() -> int:
    """The id of the broker `default`, made if missing: the field default of every row that names a broker, so
    code and tests that make rows without one file them under `default`. Cached per process (`forget_default`)."""
    global _default_id
    if _default_id is None:
        _default_id = Broker.objects.get_or_create(name=DEFAULT, defaults={"url": "", "managed": True})[0].pk
    return _default_id


def forget_default() -> None:
    global _default_id
    _default_id = None


def broker_field(**options: object) -> models.ForeignKey[Broker, Broker]:
    """The broker a row belongs to. No index of its own: each model's indexes that start with it serve its
    queries (and the check that a broker still in use cannot be deleted)."""
    return models.ForeignKey(
        Broker,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
        default=default_broker_id,
        **options,  # type: ignore[arg-type]
    )
