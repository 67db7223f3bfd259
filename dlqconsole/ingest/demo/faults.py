"""What the demo's shop sends and how it fails: message bodies, error texts and stack traces that vary the way
real ones do (durations, hosts, ports, fields, ids), so the console has real patterns to group.

Pure functions of a random.Random; no broker, no database.
"""

from __future__ import annotations

import datetime as dt
import random
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

# One round of the demo: every kind of death at least once, with some successes in between. The service cycles
# through shuffled rounds, so any window of this many messages holds every kind.
ROUND = (
    "ok",
    "ok",
    "timeout",
    "network",
    "validation",
    "rate_limited",
    "not_found",
    "auth",
    "conflict",
    "internal",
    "expired_queue_ttl",
    "expired_message_ttl",
    "overflow",
    "delivery_limit",
    "notification_ok",
    "celery_ok",
    "celery_failure",
)
# Kinds the shop's consumers fail on: the error is written into the message's headers and it is rejected.
APPLICATION_ERRORS = frozenset(
    {"timeout", "network", "validation", "rate_limited", "not_found", "auth", "conflict", "internal"}
)

CURRENCIES = ("EUR", "EUR", "EUR", "USD", "GBP", "CHF", "SEK")
WAREHOUSES = ("FRA-2", "AMS-1", "DUB-3", "WAW-1")
LOCALES = ("de-DE", "en-GB", "fr-FR", "nl-NL", "pl-PL", "sv-SE")
SERVICES = {
    # queue: (service name, language, versions seen in the fleet during a rollout, pod suffixes)
    "orders": (
        "orders-worker",
        "python",
        ("3.14.2", "3.15.0"),
        ("7d9c6b5f4-x2k8p", "7d9c6b5f4-q9wzt", "5b8f9c7d6-mm4rl"),
    ),
    "payments": ("payments-service", "java", ("2.8.11",), ("6c7f8b9d5-h7j2n", "6c7f8b9d5-p3v6c")),
}
DOWNSTREAMS = (
    ("tax-api.internal", 443),
    ("inventory-api.shop.svc.cluster.local", 8080),
    ("10.42.3.17", 5432),
    ("psp-gateway.example.net", 443),
    ("fraud-check.internal", 9443),
    ("172.20.14.9", 6379),
)


@dataclass(frozen=True)
class Failure:
    error_type: str
    message: str
    stack_trace: str


@dataclass
class Scenario:
    """One message the demo publishes (or one Celery task it sends) and what will happen to it."""

    kind: str
    queue: str
    routing_key: str = ""
    body: dict[str, Any] = field(default_factory=dict)
    failure: Failure | None = None
    expiration: str | None = None
    task_name: str = ""
    task_kwargs: dict[str, Any] = field(default_factory=dict)


def make_scenario(kind: str, rng: random.Random) -> Scenario:
    if kind in APPLICATION_ERRORS:
        queue = (
            "payments" if kind in {"internal", "auth"} and rng.random() < 0.7 else rng.choice(["orders", "payments"])
        )
        if kind == "conflict":
            queue = "orders"
        body, routing_key = _order(rng) if queue == "orders" else _payment(rng)
        return Scenario(kind, queue, routing_key, body, failure=_failure(kind, queue, body, rng))
    if kind == "ok":
        queue = rng.choice(["orders", "payments"])
        body, routing_key = _order(rng) if queue == "orders" else _payment(rng)
        return Scenario(kind, queue, routing_key, body)
    if kind == "expired_queue_ttl":
        return Scenario(kind, "emails", "emails.send", _email(rng))
    if kind == "expired_message_ttl":
        # Time-sensitive mail (a login code) says itself how long it is worth sending.
        body = {**_email(rng), "template": "login_code", "code": f"{rng.randrange(10**6):06d}"}
        return Scenario(kind, "emails", "emails.send", body, expiration=str(rng.choice([800, 1200, 1500, 2000])))
    if kind == "overflow":
        return Scenario(kind, "inventory", "inventory.adjust", _stock(rng))
    if kind in {"delivery_limit", "notification_ok"}:
        return Scenario(kind, "notifications", "notifications.push", _push(rng))
    if kind == "celery_ok":
        order_id = _order_id(rng)
        return Scenario(
            kind,
            "tasks",
            task_name="shop.invoices.generate_invoice",
            task_kwargs={"order_id": order_id, "amount": _money(rng, 20, 900), "currency": "EUR"},
        )
    if kind == "celery_failure":
        return _celery_failure(rng)
    raise ValueError(f"unknown demo scenario {kind!r}")


def _celery_failure(rng: random.Random) -> Scenario:
    order_id = _order_id(rng)
    variant = rng.randrange(4)
    if variant == 0:
        kwargs: dict[str, Any] = {
            "order_id": order_id,
            "amount": _money(rng, 20, 900),
            "currency": rng.choice(["XTS", "EURO", "BTC"]),
        }
        return Scenario("celery_failure", "tasks", task_name="shop.invoices.generate_invoice", task_kwargs=kwargs)
    if variant == 1:
        kwargs = {"order_id": order_id, "amount": _money(rng, 25000, 90000), "currency": "EUR"}
        return Scenario("celery_failure", "tasks", task_name="shop.invoices.generate_invoice", task_kwargs=kwargs)
    if variant == 2:
        kwargs = {
            "contact_id": rng.randrange(10**5, 10**6),
            "email": _email_address(rng),
            "region": rng.choice(["ap-south-1", "sa-east-1"]),
        }
        return Scenario("celery_failure", "tasks", task_name="shop.crm.sync_contact", task_kwargs=kwargs)
    kwargs = {"order_id": order_id, "email": rng.choice(["n/a", "unknown", "jan.kowalski(at)example.pl"])}
    return Scenario("celery_failure", "tasks", task_name="shop.mail.send_receipt", task_kwargs=kwargs)


def service_headers(queue: str, rng: random.Random) -> dict[str, str]:
    """x-host and x-app-version of the consumer that handled a message from `queue`."""
    name, _, versions, pods = SERVICES[queue]
    return {"x-host": f"{name}-{rng.choice(pods)}", "x-app-version": rng.choice(versions)}


def _failure(kind: str, queue: str, body: dict[str, Any], rng: random.Random) -> Failure:
    java = queue == "payments"
    host, port = rng.choice(DOWNSTREAMS)
    subject = body.get("payment_id") or body.get("order_id")
    if kind == "timeout":
        millis = rng.choice([1500, 3000, 5000, 10000, 30000])
        if java:
            return _java(
                "java.net.SocketTimeoutException",
                f"Read timed out after {millis} ms calling https://{host}/v2/captures/{subject}",
                rng,
            )
        if rng.random() < 0.5:
            return _python(
                "requests.exceptions.ReadTimeout",
                f"HTTPSConnectionPool(host='{host}', port={port}): Read timed out. (read timeout={millis / 1000:g})",
                rng,
            )
        return _python("TimeoutError", f"Request to {host}:{port} timed out after {millis}ms", rng)
    if kind == "network":
        if java:
            return _java("java.net.SocketException", f"Connection reset by peer: {host}:{port}", rng)
        if rng.random() < 0.5:
            return _python("ConnectionResetError", f"[Errno 104] Connection reset by peer ({host}:{port})", rng)
        return _python("ConnectionRefusedError", f"[Errno 111] Connection refused: {host}:{port}", rng)
    if kind == "validation":
        return _validation(java, body, rng)
    if kind == "rate_limited":
        retry_after = rng.choice([1, 2, 5, 30, 60])
        api = rng.choice(["tax-api.internal", "psp-gateway.example.net", "geo.example.org"])
        if java:
            return _java(
                "org.springframework.web.client.HttpClientErrorException$TooManyRequests",
                f"429 Too Many Requests from POST https://{api}/v1/quotes: "
                f'"rate limit exceeded, retry after {retry_after}s"',
                rng,
            )
        return _python(
            "shop.clients.RateLimitedError", f"HTTP 429 Too Many Requests from {api} (Retry-After: {retry_after})", rng
        )
    if kind == "not_found":
        if java:
            return _java("com.acme.payments.OrderNotFoundException", f"Order {body.get('order_id')} not found", rng)
        return _python("shop.orders.CustomerDoesNotExist", f"Customer {body.get('customer_id')} does not exist", rng)
    if kind == "auth":
        if java:
            return _java(
                "org.springframework.security.access.AccessDeniedException",
                f"Access is denied for merchant account M-{rng.randrange(1000, 9999)}",
                rng,
            )
        account = rng.choice(["svc-orders", "svc-orders-batch"])
        return _python("shop.clients.AuthError", f"401 Unauthorized: token expired for service account {account}", rng)
    if kind == "conflict":
        reference = f"{rng.choice(['AMZ', 'EBY', 'WEB'])}-{rng.randrange(10**6, 10**7)}"
        return _python(
            "psycopg.errors.UniqueViolation",
            'duplicate key value violates unique constraint "orders_external_ref_key"\n'
            f"DETAIL:  Key (external_ref)=({reference}) already exists.",
            rng,
        )
    if java:
        return _java(
            "java.lang.NullPointerException",
            'Cannot invoke "com.acme.payments.model.Card.getToken()" because "card" is null',
            rng,
        )
    return _python("ZeroDivisionError", "division by zero", rng)


def _validation(java: bool, body: dict[str, Any], rng: random.Random) -> Failure:
    """Break the body the way the error says, so the stored payload shows the cause."""
    if java:
        problem = rng.randrange(3)
        if problem == 0:
            body["amount"] = "-" + str(body["amount"])
            return _java(
                "jakarta.validation.ConstraintViolationException",
                f"capture.request.amount: must be greater than 0 (payment {body['payment_id']})",
                rng,
            )
        if problem == 1:
            body["currency"] = rng.choice(["EURO", "US$", "eur"])
            return _java(
                "jakarta.validation.ConstraintViolationException",
                f'capture.request.currency: must match "[A-Z]{{3}}" (payment {body["payment_id"]})',
                rng,
            )
        body.pop("card_last4", None)
        return _java(
            "org.springframework.web.bind.MethodArgumentNotValidException",
            f"Validation failed for argument [0]: field 'cardLast4' must not be null (payment {body['payment_id']})",
            rng,
        )
    problem = rng.randrange(3)
    order_id = body["order_id"]
    if problem == 0:
        quantity = rng.choice([-3, -1, 0])
        body["items"][0]["quantity"] = quantity
        return _python(
            "shop.orders.ValidationError",
            f"Order {order_id}: items[0].quantity must be a positive integer (got {quantity})",
            rng,
        )
    if problem == 1:
        body.pop("shipping_address", None)
        return _python("shop.orders.ValidationError", f"Order {order_id}: field 'shipping_address' is required", rng)
    body["customer_email"] = body["customer_email"].replace("@", " at ")
    return _python(
        "shop.orders.ValidationError",
        f"Order {order_id}: customer_email {body['customer_email']!r} is not a valid e-mail address",
        rng,
    )


def _python(error_type: str, message: str, rng: random.Random) -> Failure:
    handler = rng.choice(
        [
            ("orders/handlers.py", "handle_order_created", "quote = tax_client.quote(order)"),
            ("orders/handlers.py", "handle_order_updated", "reservation = inventory.reserve(order.items)"),
            ("orders/fulfilment.py", "allocate", "warehouse = self.router.pick(order)"),
        ]
    )
    short = error_type.rsplit(".", 1)[-1]
    trace = (
        "Traceback (most recent call last):\n"
        f'  File "/app/shop/worker/consumer.py", line {rng.randrange(80, 95)}, in on_message\n'
        "    result = handler(envelope)\n"
        f'  File "/app/shop/{handler[0]}", line {rng.randrange(100, 260)}, in {handler[1]}\n'
        f"    {handler[2]}\n"
        f'  File "/app/shop/clients/base.py", line {rng.randrange(40, 70)}, in call\n'
        "    response.raise_for_status()\n"
        f"{error_type if '.' in error_type else short}: {message}"
    )
    return Failure(error_type=error_type, message=message, stack_trace=trace)


def _java(error_type: str, message: str, rng: random.Random) -> Failure:
    frames = [
        f"com.acme.payments.psp.PspClient.capture(PspClient.java:{rng.randrange(180, 240)})",
        f"com.acme.payments.CaptureService.capture(CaptureService.java:{rng.randrange(60, 120)})",
        f"com.acme.payments.messaging.CaptureListener.onMessage(CaptureListener.java:{rng.randrange(40, 70)})",
        "org.springframework.amqp.rabbit.listener.AbstractMessageListenerContainer.doInvokeListener("
        "AbstractMessageListenerContainer.java:1662)",
        "org.springframework.amqp.rabbit.listener.SimpleMessageListenerContainer.doReceiveAndExecute("
        "SimpleMessageListenerContainer.java:1005)",
        "java.base/java.lang.Thread.run(Thread.java:1583)",
    ]
    trace = f"{error_type}: {message}\n" + "".join(f"\tat {frame}\n" for frame in frames)
    return Failure(error_type=error_type, message=message, stack_trace=trace.rstrip("\n"))


def _order_id(rng: random.Random) -> int:
    return rng.randrange(100000, 999999)


def _money(rng: random.Random, low: int, high: int) -> str:
    return str(Decimal(rng.randrange(low * 100, high * 100)) / 100)


def _email_address(rng: random.Random) -> str:
    first = rng.choice(["anna", "jan", "sofia", "lukas", "emma", "noah", "mia", "oliver"])
    last = rng.choice(["schmidt", "kowalski", "dubois", "jansen", "berg", "murphy"])
    return f"{first}.{last}@{rng.choice(['example.com', 'example.org', 'mail.example.net'])}"


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def _order(rng: random.Random) -> tuple[dict[str, Any], str]:
    lines = [
        (f"SKU-{rng.randrange(1000, 9999)}", rng.randrange(1, 4), _money(rng, 3, 120))
        for _ in range(rng.randrange(1, 4))
    ]
    items = [{"sku": sku, "quantity": quantity, "unit_price": price} for sku, quantity, price in lines]
    total = sum((Decimal(price) * quantity for _, quantity, price in lines), Decimal(0))
    body = {
        "order_id": _order_id(rng),
        "customer_id": rng.randrange(1000, 99999),
        "customer_email": _email_address(rng),
        "items": items,
        "currency": rng.choice(CURRENCIES),
        "total": str(total),
        "shipping_address": {
            "country": rng.choice(["DE", "NL", "FR", "PL", "SE", "IE"]),
            "postcode": f"{rng.randrange(10000, 99999)}",
        },
        "created_at": _now(),
    }
    return body, rng.choice(["orders.created", "orders.created", "orders.updated", "orders.cancelled"])


def _payment(rng: random.Random) -> tuple[dict[str, Any], str]:
    body = {
        "payment_id": f"pay_{uuid.UUID(int=rng.getrandbits(128)).hex[:16]}",
        "order_id": _order_id(rng),
        "amount": _money(rng, 5, 2500),
        "currency": rng.choice(CURRENCIES),
        "method": rng.choice(["card", "card", "sepa_debit", "paypal"]),
        "card_last4": f"{rng.randrange(10000):04d}",
        "requested_at": _now(),
    }
    return body, rng.choice(["payments.capture", "payments.capture", "payments.refund"])


def _email(rng: random.Random) -> dict[str, Any]:
    return {
        "to": _email_address(rng),
        "template": rng.choice(["order_confirmation", "shipping_update", "password_reset"]),
        "locale": rng.choice(LOCALES),
        "order_id": _order_id(rng),
    }


def _stock(rng: random.Random) -> dict[str, Any]:
    return {
        "sku": f"SKU-{rng.randrange(1000, 9999)}",
        "warehouse": rng.choice(WAREHOUSES),
        "delta": rng.choice([-3, -2, -1, -1, 1, 5, 20]),
        "reason": rng.choice(["sale", "return", "restock", "stocktake"]),
        "at": _now(),
    }


def _push(rng: random.Random) -> dict[str, Any]:
    return {
        "user_id": rng.randrange(10**5, 10**7),
        "channel": "push",
        "device_token": uuid.UUID(int=rng.getrandbits(128)).hex,
        "title": rng.choice(["Your order has shipped", "Payment received", "Back in stock"]),
        "platform": rng.choice(["ios", "android"]),
    }
