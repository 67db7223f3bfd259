"""Generate tests/data/error_corpus.jsonl: labelled error messages for judging failure grouping.

    .venv/bin/python tests/data/make_corpus.py          # rewrites error_corpus.jsonl (deterministic seed)

Each line is one dead letter's error: {"cause", "split", "error_type", "message", "stack_trace"}. A *cause* is
one thing that went wrong (one bug, one broken dependency, one kind of bad input); every message of a cause
should land in one pattern, and no other message with it.

The messages are written the way real services fail (Python, Java/Kotlin, .NET, Go and Node exceptions; HTTP
clients; database drivers; broker clients; validation libraries; cloud SDKs). What makes them hard on purpose:
- variable parts of every shape: ids, hosts, numbers, times, quoted values, and plain words (user names, queue
  names, tenant and region names) that no mask recognises;
- look-alike causes: the same template with a different fixed word (a different dependency host, constraint,
  field, status code, decline reason), which must stay apart;
- long messages (SQL, JSON and HTML bodies), multi-line messages, and stack traces where the same exception
  type is thrown from different places (different causes) or the same place via different library paths and
  releases (one cause);
- some cases no text-only method gets right (a variable value of several words, a variable enumeration in two
  places at once); they stay in, so the score is honest.

A second list, NEW_CAUSES (Python, Java, .NET, Go, Node/TypeScript, Ruby, PHP and Rust), holds the kinds that
word-level grouping splits or merges wrongly:
- one cause whose messages differ in a word or a few taken from a short list of the cause's own ({=name} in its
  template): a quoted identifier (event kind, template, bean, handler), a field or property name in a validation
  error, an enum constant, the host in a TLS error, a subject, topic, exchange or queue, XML element names in a
  parser error, a value with spaces inside a URL, a variable first word (host:port, job, node), a run of values
  whose token count varies ("0 bytes", "20480 bytes (20.00 KiB)");
- look-alikes that must stay apart: the same exception type thrown from the same frames with another message, a
  refused or timed-out connection to another service (only the host or the port differs), the same request
  failing with another HTTP status.
They are generated after CAUSES from a seed of their own and written after its rows, which stay as they were.

Causes are split into "train" and "heldout" by family (look-alikes stay together): one family in five of CAUSES,
two in five of NEW_CAUSES. The benchmark reports both, and grouping must never be tuned on the held-out part.
"""

from __future__ import annotations

import json
import random
import re
import string
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SEED = 20261125
OUTPUT = Path(__file__).with_name("error_corpus.jsonl")
MIN_MESSAGES = 3000

R = random.Random  # the type of the generator every slot function receives


def _words(text: str) -> list[str]:
    return text.split()


USERS = _words(
    """
    alice bob carol dave erin frank grace heidi ivan judy mallory niaj olivia peggy rupert sybil trent victor walter
    xavier yvonne zoe amir bea chen dmitri elena fatima goran hana igor jonas kasia lars mei nora oskar priya
    quentin rosa sven tariq ulla vikram wanda yusuf zainab j.smith m.garcia k.oconnor a.nguyen svc-import
    svc-billing ops-robot marketing qa.team
    """
)
FIRST_NAMES = _words(
    """
    Alice Bob Carol David Erin Frank Grace Heidi Ivan Judy Olivia Peggy Rupert Victor Walter Xavier Yvonne Zoe Amir
    Chen Elena Fatima Jonas Mei Nora Priya Rosa Sven Tariq
    """
)
LAST_NAMES = _words(
    """
    Smith Garcia Nguyen Okafor Schmidt Rossi Kowalski Tanaka Silva Dubois Jensen Novak Haddad Larsen Moreau Costa
    Ivanova Müller Fischer Brown
    """
)
TENANTS = _words(
    """
    acme globex initech umbrella hooli stark wayne wonka tyrell cyberdyne soylent vandelay pied-piper dunder-mifflin
    oceanic gringotts monarch aperture blackmesa nakatomi
    """
)
QUEUES = _words(
    """
    orders orders-eu orders-us orders-apac billing-events email-outbox invoices shipments returns payouts refunds
    notifications sms-outbox push-outbox webhooks search-index audit-log inventory-sync price-updates loyalty-points
    fraud-checks exports imports thumbnails
    """
)
REGION_WORDS = _words(
    """
    frankfurt dublin paris london stockholm milan virginia ohio oregon california montreal saopaulo tokyo osaka
    seoul singapore sydney mumbai
    """
)
REGIONS = _words(
    """
    eu-west-1 eu-west-2 eu-central-1 eu-north-1 us-east-1 us-east-2 us-west-2 ap-south-1 ap-southeast-2
    ap-northeast-1 sa-east-1 ca-central-1
    """
)
COUNTRIES = _words(
    """
    Germany France Spain Italy Poland Sweden Norway Denmark Austria Portugal Ireland Belgium Brazil Canada Mexico
    Japan Kenya Nigeria Chile Peru
    """
)
CITIES = _words(
    """
    Berlin Hamburg Munich Lyon Lisbon Porto Madrid Seville Milan Turin Krakow Gdansk Oslo Bergen Aarhus Vienna Graz
    Dublin Cork Ghent
    """
)
PROJECTS = _words(
    """
    checkout storefront mobile-app data-lake warehouse-ui partner-portal analytics crm-sync backoffice
    pricing-engine
    """
)
BUCKETS = _words(
    """
    acme-invoices media-uploads exports-prod raw-events thumbnails-cdn backups-eu customer-docs label-pdfs
    """
)
PRODUCTS = """Blue Widget|Travel Mug|Desk Lamp|Wool Scarf|Trail Runner|Espresso Grinder|Yoga Mat|Phone Case|Gift
Card|Rain Jacket|Cast Iron Pan|Noise Cancelling Headphones|Standing Desk|Bamboo Cutting Board""".replace(
    "\n", " "
).split("|")
STREETS = """Baker Street|Main St|Rue de Rivoli|Calle Mayor|Via Roma|Ulica Długa|Karl-Marx-Allee|Old Kent Road
|Avenida da Liberdade|Kungsgatan|Strøget|Herengracht|High Street|Elm Avenue""".replace("\n", "").split("|")
WORDS = _words(
    """
    lorem ipsum dolor amet quick brown fox lazy dog please call me back tomorrow morning leave at door ring twice
    fragile gift wrap thanks urgent delivery before noon side entrance
    """
)
BAD_VALUES = _words(
    """
    abc n/a none null NaN tbd unknown heavy twelve ? - yes no true undefined foo test
    """
)
TIMEZONES = _words(
    """
    Europe/Berln Europe/Lodnon America/NewYork Asia/Tokio US/Pacifc Europe/Pariss Mars/Olympus Europe/Amsterdm
    """
)
CURRENCIES = ["EUR", "USD", "GBP"]


def _chars(rng: R, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


B62 = string.ascii_letters + string.digits
HEX = "0123456789abcdef"


def _uuid(rng: R) -> str:
    h = _chars(rng, HEX, 32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{rng.choice('89ab')}{h[17:20]}-{h[20:]}"


def _ip(rng: R) -> str:
    return rng.choice(
        [
            f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
            f"172.{rng.randint(16, 31)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
            f"192.168.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
        ]
    )


def _ts(rng: R) -> str:
    return (
        f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
        f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999):03d}Z"
    )


def _amount(rng: R) -> str:
    return f"{rng.randint(1, 2500)}.{rng.randint(0, 99):02d}"


def _free_text(rng: R) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))


# Variable slots: a fresh value for every message.
SLOTS: dict[str, Callable[[R], str]] = {
    "int": lambda rng: str(rng.randint(1, 999999)),
    "small": lambda rng: str(rng.randint(1, 40)),
    "big": lambda rng: str(rng.randint(10**9, 10**12)),
    "ms": lambda rng: str(rng.choice([250, 500, 1000, 1500, 2000, 3000, 5000, 10000, 30000])),
    "port": lambda rng: str(rng.randint(32768, 60999)),
    "uuid": _uuid,
    "hex2": lambda rng: _chars(rng, HEX, 2),
    "hex8": lambda rng: _chars(rng, HEX, 8),
    "hex12": lambda rng: _chars(rng, HEX, 12),
    "hex24": lambda rng: _chars(rng, HEX, 24),
    "sha": lambda rng: _chars(rng, HEX, 40),
    "ip": _ip,
    "ts": _ts,
    "date": lambda rng: f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
    "time": lambda rng: f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}",
    "user": lambda rng: rng.choice(USERS),
    "first": lambda rng: rng.choice(FIRST_NAMES),
    "fullname": lambda rng: f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}",
    "email": lambda rng: (
        f"{rng.choice(USERS).replace('.', '')}{rng.choice(['', '', str(rng.randint(1, 99))])}@"
        f"{rng.choice(['example.com', 'mail.example.org', 'acme.test', 'gmail.com'])}"
    ),
    "tenant": lambda rng: rng.choice(TENANTS),
    "queue": lambda rng: rng.choice(QUEUES),
    "region": lambda rng: rng.choice(REGIONS),
    "regionword": lambda rng: rng.choice(REGION_WORDS),
    "country": lambda rng: rng.choice(COUNTRIES),
    "city": lambda rng: rng.choice(CITIES),
    "project": lambda rng: rng.choice(PROJECTS),
    "bucket": lambda rng: rng.choice(BUCKETS),
    "product": lambda rng: rng.choice(PRODUCTS),
    "street": lambda rng: f"{rng.randint(1, 240)} {rng.choice(STREETS)}",
    "freetext": _free_text,
    "badvalue": lambda rng: rng.choice(BAD_VALUES),
    "tz": lambda rng: rng.choice(TIMEZONES),
    "currency": lambda rng: rng.choice(CURRENCIES),
    "amount": _amount,
    "order": lambda rng: "ord_" + _chars(rng, B62, 14),
    "charge": lambda rng: "ch_" + _chars(rng, B62, 24),
    "cust": lambda rng: "cus_" + _chars(rng, B62, 14),
    "pay": lambda rng: "pay_" + _chars(rng, B62, 16),
    "sku": lambda rng: f"SKU-{rng.randint(10000, 99999)}",
    "invoice": lambda rng: f"INV-2026-{rng.randint(1, 99999):05d}",
    "tracking": lambda rng: "1Z" + _chars(rng, string.ascii_uppercase + string.digits, 16),
    "reqid": lambda rng: _chars(rng, string.ascii_uppercase + string.digits, 52),
    "awsreq": lambda rng: _chars(rng, string.ascii_uppercase + string.digits, 16),
    "b64": lambda rng: _chars(rng, B62 + "+/", 56) + "=",
    "pod": lambda rng: (
        f"{rng.choice(['orders', 'billing', 'shipping'])}-worker-{_chars(rng, HEX, 10)}-"
        f"{_chars(rng, 'bcdfghjklmnpqrstvwxz2456789', 5)}"
    ),
    "worker": lambda rng: f"worker-{rng.randint(1, 24)}",
    "pid": lambda rng: str(rng.randint(1000, 65000)),
    "char": lambda rng: rng.choice(["<", "N", "o", "u", "T", "s", "'", "}"]),
    "col": lambda rng: str(rng.randint(1, 4000)),
    "version": lambda rng: f"{rng.randint(1, 3)}.{rng.randint(0, 30)}.{rng.randint(0, 9)}",
    "path": lambda rng: (
        f"/data/exports/{rng.choice(TENANTS)}/{rng.randint(2024, 2026)}/report-{rng.randint(1, 999)}.csv"
    ),
}
SLOT = re.compile(r"\{\{|\}\}|\{(\w+)\}")


def fill(template: str, rng: R) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "{{":
            return "{"
        if match.group(0) == "}}":
            return "}"
        return SLOTS[match.group(1)](rng)

    return SLOT.sub(replace, template)


@dataclass
class Cause:
    cause: str
    family: str
    error_type: str
    template: str
    trace: Callable[[R], str] | None = None
    # Some causes are rare, some are floods: the number of messages is drawn per cause.
    weight: float = 1.0
    extra: dict[str, str] = field(default_factory=dict)
    # {=name} in the template or trace: one value of picks[name] per message (see NEW_CAUSES).
    picks: dict[str, list[str]] = field(default_factory=dict)


CAUSES: list[Cause] = []


def cause(cid: str, error_type: str, template: str, *, trace: Callable[[R], str] | None = None, weight: float = 1.0):
    CAUSES.append(Cause(cid, cid, error_type, template, trace, weight))


def _variants(error_type: str, template: str, variants: list[tuple[str, ...] | str]) -> list[tuple[str, str, str]]:
    """(slug, error type, template) of each variant: [V1], [V2]... replaced by its fixed word (or words)."""
    out = []
    for variant in variants:
        values = (variant,) if isinstance(variant, str) else variant
        text = template
        kind = error_type
        for number, value in enumerate(values, start=1):
            text = text.replace(f"[V{number}]", value)
            kind = kind.replace(f"[V{number}]", value)
        slug = re.sub(r"[^a-z0-9]+", "-", "-".join(values).lower()).strip("-")[:40]
        out.append((slug, kind, text))
    return out


def family(fid: str, error_type: str, template: str, variants: list[tuple[str, ...] | str], *, weight: float = 1.0):
    """Look-alike causes: one template, a different fixed word (or words) each; [V1], [V2]... mark them."""
    for slug, kind, text in _variants(error_type, template, variants):
        CAUSES.append(Cause(f"{fid}:{slug}", fid, kind, text, None, weight))


# Stack trace builders ----------------------------------------------------------------------------------------


def _line(rng: R, base: int) -> int:
    # The same code at a few releases: line numbers move a little between deploys.
    return base + rng.choice([0, 0, 0, 2, 5, 11])


PY_LIB = "/usr/local/lib/python3.12/site-packages"
CELERY_OUTER = [
    (f"{PY_LIB}/celery/app/trace.py", 453, "trace_task", "R = retval = fun(*args, **kwargs)"),
    (f"{PY_LIB}/celery/app/trace.py", 736, "__protected_call__", "return self.run(*args, **kwargs)"),
]
KOMBU_OUTER = [
    (
        f"{PY_LIB}/kombu/messaging.py",
        656,
        "_receive_callback",
        "return on_m(message) if on_m else self.receive(decoded, message)",
    ),
    (f"{PY_LIB}/kombu/messaging.py", 625, "receive", "[callback(body, message) for callback in callbacks]"),
]


def py_trace(
    app: list[tuple[str, int, str, str]],
    exception: str,
    *,
    inner_lib: list[tuple[str, int, str, str]] | None = None,
    outer_choices: list[list[tuple[str, int, str, str]]] | None = None,
    cause_block: tuple[list[tuple[str, int, str, str]], str] | None = None,
) -> Callable[[R], str]:
    """A Python traceback: outer (framework) frames, the application frames (outermost first), optional
    library frames inside, then the exception line; optionally chained from a root cause."""

    def build(rng: R) -> str:
        outer = rng.choice(outer_choices or [CELERY_OUTER, KOMBU_OUTER])
        frames = list(outer) + list(app) + list(inner_lib or [])

        def block(frames: list[tuple[str, int, str, str]], exception_line: str) -> str:
            out = ["Traceback (most recent call last):"]
            for path, line, function, code in frames:
                out.append(f'  File "{path}", line {_line(rng, line)}, in {function}')
                out.append(f"    {code}")
            out.append(fill(exception_line, rng))
            return "\n".join(out)

        text = block(frames, exception)
        if cause_block is not None:
            root_frames, root_exception = cause_block
            text = (
                block(root_frames, root_exception)
                + "\n\nThe above exception was the direct cause of the following exception:\n\n"
                + text
            )
        return text

    return build


def java_trace(
    header: str,
    frames: list[str],
    *,
    caused_by: list[tuple[str, list[str]]] | None = None,
    outer_choices: list[list[str]] | None = None,
) -> Callable[[R], str]:
    """A JVM trace: frames are "pkg.Class.method(File.java:N)" with N a base line number, innermost first."""
    spring_outer = [
        "org.springframework.amqp.rabbit.listener.adapter.MessagingMessageListenerAdapter.invokeHandler("
        "MessagingMessageListenerAdapter.java:220)",
        "org.springframework.amqp.rabbit.listener.adapter.MessagingMessageListenerAdapter.onMessage("
        "MessagingMessageListenerAdapter.java:148)",
        "org.springframework.amqp.rabbit.listener.AbstractMessageListenerContainer.doInvokeListener("
        "AbstractMessageListenerContainer.java:1662)",
        "org.springframework.amqp.rabbit.listener.SimpleMessageListenerContainer$AsyncMessageProcessingConsumer.run("
        "SimpleMessageListenerContainer.java:1354)",
        "java.base/java.lang.Thread.run(Thread.java:1583)",
    ]
    kafka_outer = [
        "org.springframework.kafka.listener.KafkaMessageListenerContainer$ListenerConsumer.doInvokeOnMessage("
        "KafkaMessageListenerContainer.java:2785)",
        "org.springframework.kafka.listener.KafkaMessageListenerContainer$ListenerConsumer.run("
        "KafkaMessageListenerContainer.java:1316)",
        "java.base/java.util.concurrent.Executors$RunnableAdapter.call(Executors.java:572)",
        "java.base/java.lang.Thread.run(Thread.java:1583)",
    ]

    def render(frame: str, rng: R) -> str:
        match = re.match(r"(.*\(\w+\.(?:java|kt):)(\d+)\)$", frame)
        if match:
            return f"\tat {match.group(1)}{_line(rng, int(match.group(2)))})"
        return f"\tat {frame}"

    def build(rng: R) -> str:
        outer = rng.choice(outer_choices or [spring_outer, kafka_outer])
        proxy = (
            [f"jdk.proxy2/jdk.proxy2.$Proxy{rng.randint(100, 190)}.handle(Unknown Source)"]
            if rng.random() < 0.4
            else []
        )
        lines = [fill(header, rng)]
        lines += [render(frame, rng) for frame in frames + proxy + outer]
        for cause_header, cause_frames in caused_by or []:
            lines.append("Caused by: " + fill(cause_header, rng))
            lines += [render(frame, rng) for frame in cause_frames]
            lines.append(f"\t... {rng.randint(8, 30)} more")
        return "\n".join(lines)

    return build


def go_trace(panic: str, frames: list[tuple[str, str]]) -> Callable[[R], str]:
    def build(rng: R) -> str:
        lines = [fill(panic, rng), "", f"goroutine {rng.randint(1, 900)} [running]:"]
        for function, location in frames:
            lines.append(f"{function}({', '.join('0x' + _chars(rng, HEX, 10) for _ in range(rng.randint(1, 3)))})")
            path, _, line = location.rpartition(":")
            lines.append(f"\t{path}:{_line(rng, int(line))} +0x{_chars(rng, HEX, 3)}")
        lines.append(f"created by net/http.(*Server).Serve in goroutine {rng.randint(1, 40)}")
        lines.append(f"\t/usr/local/go/src/net/http/server.go:3285 +0x{_chars(rng, HEX, 3)}")
        return "\n".join(lines)

    return build


def node_trace(header: str, frames: list[tuple[str, str]]) -> Callable[[R], str]:
    """frames: (function, "file:line"), innermost first; library frames are mixed in as given."""

    def build(rng: R) -> str:
        lines = [fill(header, rng)]
        for function, location in frames:
            path, _, line = location.rpartition(":")
            where = path if path.startswith("<") else f"{path}:{_line(rng, int(line))}:{rng.randint(5, 40)}"
            lines.append(f"    at {function} ({where})" if function else f"    at {where}")
        if rng.random() < 0.5:
            lines.append("    at process.processTicksAndRejections (node:internal/process/task_queues:95:5)")
        return "\n".join(lines)

    return build


def dotnet_trace(header: str, frames: list[tuple[str, str | None]]) -> Callable[[R], str]:
    def build(rng: R) -> str:
        lines = [fill(header, rng)]
        for function, location in frames:
            if location:
                path, _, line = location.rpartition(":")
                lines.append(f"   at {function} in {path}:line {_line(rng, int(line))}")
            else:
                lines.append(f"   at {function}")
        if rng.random() < 0.5:
            lines.append("--- End of stack trace from previous location ---")
            lines.append(
                "   at MassTransit.Middleware.ConsumerMessageFilter`2.MassTransit.IFilter<MassTransit."
                "ConsumerConsumeContext<TConsumer,TMessage>>.Send(ConsumerConsumeContext`2 context, "
                "IPipe`1 next)"
            )
        return "\n".join(lines)

    return build


# Python: HTTP clients --------------------------------------------------------------------------------------------

family(
    "py-requests-refused",
    "requests.exceptions.ConnectionError",
    "HTTPSConnectionPool(host='[V1]', port=443): Max retries exceeded with url: [V2]{int} (Caused by "
    "NewConnectionError('<urllib3.connection.HTTPSConnection object at 0x7f{hex8}>: Failed to establish a new "
    "connection: [Errno 111] Connection refused'))",
    [
        ("payments-api.internal", "/v1/charges/"),
        ("inventory-api.internal", "/v2/stock/"),
        ("shipping-api.internal", "/v1/labels/"),
    ],
    weight=1.6,
)
family(
    "py-requests-read-timeout",
    "requests.exceptions.ReadTimeout",
    "HTTPSConnectionPool(host='[V1]', port=443): Read timed out. (read timeout=30)",
    ["payments-api.internal", "tax-api.internal"],
)
family(
    "py-requests-http-error",
    "requests.exceptions.HTTPError",
    "[V1] for url: https://api.partner.example/v2/orders/{order}",
    [
        "500 Server Error: Internal Server Error",
        "502 Server Error: Bad Gateway",
        "503 Server Error: Service Unavailable",
    ],
    weight=1.4,
)
cause(
    "py-requests-404-customer",
    "requests.exceptions.HTTPError",
    "404 Client Error: Not Found for url: https://api.crm.example/v1/customers/{cust}?expand=addresses",
)
cause(
    "py-httpx-503-geo",
    "httpx.HTTPStatusError",
    "Server error '503 Service Unavailable' for url 'https://geo.internal/v1/lookup?ip={ip}'\nFor more "
    "information check: https://developer.mozilla.org/en-US/docs/Web/HTTP/Status/503",
)
cause("py-httpx-connect-timeout", "httpx.ConnectTimeout", "timed out", weight=0.6)
cause(
    "py-aiohttp-search-down",
    "aiohttp.client_exceptions.ClientConnectorError",
    "Cannot connect to host search.internal:9200 ssl:default [Connect call failed ('{ip}', 9200)]",
)
cause(
    "py-ssl-expired-erp",
    "requests.exceptions.SSLError",
    "HTTPSConnectionPool(host='legacy-erp.corp.example', port=443): Max retries exceeded with url: "
    "/api/sync/{int} (Caused by SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate "
    "verify failed: certificate has expired (_ssl.c:1006)')))",
)
cause(
    "py-requests-chunked",
    "requests.exceptions.ChunkedEncodingError",
    "('Connection broken: IncompleteRead({int} bytes read, {int} more expected)', IncompleteRead({int} bytes "
    "read, {int} more expected))",
)
cause(
    "py-nginx-html-502",
    "carriers.errors.UpstreamError",
    "Unexpected response from https://carrier-api.example/track/{tracking}: <html>\r\n<head><title>502 Bad "
    "Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>"
    "nginx/1.25.3</center>\r\n</body>\r\n</html>",
)
cause(
    "py-webhook-tenant",
    "webhooks.DeliveryFailed",
    "Webhook delivery to https://hooks.{tenant}.example/dlq/{hex8} failed after {small} attempts: HTTP 410 Gone",
)

# Python: databases -----------------------------------------------------------------------------------------------

cause(
    "py-pg-refused",
    "psycopg2.OperationalError",
    'connection to server at "db-primary.internal" ({ip}), port 5432 failed: Connection refused\n\tIs the '
    "server running on that host and accepting TCP/IP connections?",
    weight=1.5,
)
cause(
    "py-pg-too-many-clients",
    "psycopg.OperationalError",
    'connection failed: connection to server at "{ip}", port 5432 failed: FATAL:  sorry, too many clients already',
)
family(
    "py-pg-unique",
    "psycopg2.errors.UniqueViolation",
    'duplicate key value violates unique constraint "[V1]"\nDETAIL:  Key ([V2])=([V3]) already exists.',
    [("users_email_key", "email", "{email}"), ("orders_external_id_key", "external_id", "EXT-{int}")],
)
family(
    "py-pg-undefined-table",
    "psycopg2.errors.UndefinedTable",
    "relation \"[V1]\" does not exist\nLINE 1: INSERT INTO [V1] (id, payload, created_at) VALUES ({int}, '{{}}', "
    "now())\n                    ^",
    ["audit_events", "order_snapshots"],
)
cause(
    "py-pg-deadlock",
    "psycopg2.errors.DeadlockDetected",
    "deadlock detected\nDETAIL:  Process {pid} waits for ShareLock on transaction {int}; blocked by process {pid}.\n"
    "Process {pid} waits for ShareLock on transaction {int}; blocked by process {pid}.\nHINT:  See server log for "
    'query details.\nCONTEXT:  while updating tuple ({int},{small}) in relation "inventory"',
)
family(
    "py-sqla-not-null",
    "sqlalchemy.exc.IntegrityError",
    '(psycopg2.errors.NotNullViolation) null value in column "[V1]" of relation "shipments" violates not-null '
    "constraint\nDETAIL:  Failing row contains ({int}, {order}, null, {ts}).\n\n[SQL: INSERT INTO shipments "
    "(order_id, [V1], created_at) VALUES (%(order_id)s, %([V1])s, %(created_at)s) RETURNING shipments.id]\n"
    "[parameters: {{'order_id': '{order}', '[V1]': None, 'created_at': '{ts}'}}]\n(Background on this error at: "
    "https://sqlalche.me/e/20/gkpj)",
    ["carrier_id", "address_id"],
)
cause(
    "py-sqla-pool",
    "sqlalchemy.exc.TimeoutError",
    "QueuePool limit of size 5 overflow 10 reached, connection timed out, timeout 30.00 (Background on this error "
    "at: https://sqlalche.me/e/20/3o7r)",
)
cause(
    "py-django-fk",
    "django.db.utils.IntegrityError",
    'insert or update on table "order_lines" violates foreign key constraint "order_lines_product_id_fkey"\n'
    'DETAIL:  Key (product_id)=({int}) is not present in table "products".',
)
cause(
    "py-mysql-deadlock",
    "pymysql.err.OperationalError",
    "(1213, 'Deadlock found when trying to get lock; try restarting transaction')",
)
family(
    "py-mysql-duplicate",
    "pymysql.err.IntegrityError",
    "(1062, \"Duplicate entry '[V1]' for key '[V2]'\")",
    [("{email}", "users.email"), ("{user}", "users.username")],
)
cause(
    "py-mysql-gone",
    "pymysql.err.OperationalError",
    "(2006, \"MySQL server has gone away (BrokenPipeError(32, 'Broken pipe'))\")",
)
cause(
    "py-redis-refused",
    "redis.exceptions.ConnectionError",
    "Error 111 connecting to redis-cache.internal:6379. Connection refused.",
)
cause(
    "py-redis-oom",
    "redis.exceptions.OutOfMemoryError",
    "command not allowed when used memory > 'maxmemory'.",
)
cause(
    "py-mongo-dup",
    "pymongo.errors.DuplicateKeyError",
    "E11000 duplicate key error collection: shop.carts index: user_id_1 dup key: {{ user_id: ObjectId('{hex24}') }}, "
    "full error: {{'index': 0, 'code': 11000, 'errmsg': 'E11000 duplicate key error collection: shop.carts index: "
    "user_id_1 dup key: {{ user_id: ObjectId(\\'{hex24}\\') }}'}}",
)
cause(
    "py-mongo-no-primary",
    "pymongo.errors.ServerSelectionTimeoutError",
    "mongo-0.mongo.svc:27017: timed out (configured timeouts: socketTimeoutMS: 20000.0ms, connectTimeoutMS: "
    "20000.0ms), Timeout: 30s, Topology Description: <TopologyDescription id: {hex24}, topology_type: "
    "ReplicaSetNoPrimary, servers: [<ServerDescription ('mongo-0.mongo.svc', 27017) server_type: Unknown, rtt: None, "
    "error=NetworkTimeout('mongo-0.mongo.svc:27017: timed out (configured timeouts: socketTimeoutMS: 20000.0ms, "
    "connectTimeoutMS: 20000.0ms)')>]>",
)
for model in ["Order", "Customer", "Invoice"]:
    cause(f"py-django-doesnotexist:{model.lower()}", f"{model}.DoesNotExist", f"{model} matching query does not exist.")
cause(
    "py-sqlite-locked",
    "sqlite3.OperationalError",
    "database is locked",
    weight=0.5,
)

# Python: validation and parsing ---------------------------------------------------------------------------------

family(
    "py-pydantic-missing",
    "pydantic_core._pydantic_core.ValidationError",
    "1 validation error for [V1]\n[V2]\n  Field required [type=missing, input_value={{'id': {int}, 'amount': "
    "'{amount}'}}, input_type=dict]\n    For further information visit https://errors.pydantic.dev/2.7/v/missing",
    [("OrderCreated", "customer_id"), ("OrderCreated", "currency"), ("PaymentCaptured", "payment_id")],
)
cause(
    "py-pydantic-float",
    "pydantic_core._pydantic_core.ValidationError",
    "1 validation error for ShipmentRequested\nweight_kg\n  Input should be a valid number, unable to parse string "
    "as a number [type=float_parsing, input_value='{badvalue}', input_type=str]\n    For further information visit "
    "https://errors.pydantic.dev/2.7/v/float_parsing",
)
cause(
    "py-pydantic-v1-email",
    "pydantic.error_wrappers.ValidationError",
    "1 validation error for SignupEvent\nemail\n  value is not a valid email address (type=value_error.email)",
)
cause(
    "py-marshmallow",
    "marshmallow.exceptions.ValidationError",
    "{{'email': ['Not a valid email address.'], 'birth_date': ['Not a valid date.']}}",
)
family(
    "py-jsonschema-required",
    "jsonschema.exceptions.ValidationError",
    "'[V1]' is a required property\n\nFailed validating 'required' in schema['properties']['customer']:\n    "
    "{{'type': 'object', 'required': ['email', 'phone', 'name']}}\n\nOn instance['customer']:\n    {{'name': "
    "'{first}'}}",
    ["email", "phone"],
)
cause("py-json-expecting-value", "json.decoder.JSONDecodeError", "Expecting value: line 1 column {col} (char {col})")
cause(
    "py-json-delimiter",
    "json.decoder.JSONDecodeError",
    "Expecting ',' delimiter: line {small} column {col} (char {col})",
)
cause(
    "py-json-unterminated",
    "json.decoder.JSONDecodeError",
    "Unterminated string starting at: line 1 column {col} (char {col})",
)
cause("py-requests-json", "requests.exceptions.JSONDecodeError", "Expecting value: line 1 column 1 (char 0)")
cause(
    "py-unicode",
    "UnicodeDecodeError",
    "'utf-8' codec can't decode byte 0x{hex2} in position {small}: invalid start byte",
)
cause("py-int-literal", "ValueError", "invalid literal for int() with base 10: '{badvalue}'", weight=1.3)
cause("py-decimal", "decimal.InvalidOperation", "[<class 'decimal.ConversionSyntax'>]")
cause("py-zoneinfo", "zoneinfo._common.ZoneInfoNotFoundError", "'No time zone found with key {tz}'")
cause("py-jwt-expired", "jwt.exceptions.ExpiredSignatureError", "Signature has expired")
cause("py-base64", "binascii.Error", "Incorrect padding")
cause("py-date-format", "ValueError", "time data '{badvalue}' does not match format '%Y-%m-%dT%H:%M:%S%z'")
cause("py-memory", "MemoryError", "", weight=0.4)
cause("py-disk-full", "OSError", "[Errno 28] No space left on device", weight=0.6)
cause("py-permission-export", "PermissionError", "[Errno 13] Permission denied: '{path}'")
cause("py-file-missing-upload", "FileNotFoundError", "[Errno 2] No such file or directory: '/tmp/uploads/{uuid}.csv'")

# Python: Celery, brokers, cloud SDKs ---------------------------------------------------------------------------

cause(
    "py-celery-worker-lost",
    "billiard.exceptions.WorkerLostError",
    "Worker exited prematurely: signal 9 (SIGKILL) Job: {small}.",
)
cause(
    "py-celery-soft-limit",
    "celery.exceptions.SoftTimeLimitExceeded",
    "SoftTimeLimitExceeded()",
)
cause(
    "py-celery-max-retries",
    "celery.exceptions.MaxRetriesExceededError",
    "Can't retry orders.tasks.sync_order[{uuid}] args:({int},) kwargs:{{}}",
)
cause(
    "py-celery-max-retries-invoice",
    "celery.exceptions.MaxRetriesExceededError",
    "Can't retry billing.tasks.send_invoice[{uuid}] args:('{invoice}',) kwargs:{{'resend': False}}",
)
family(
    "py-boto-client-error",
    "botocore.exceptions.ClientError",
    "An error occurred ([V1]) when calling the [V2] operation[V3]: [V4]",
    [
        ("ThrottlingException", "PutItem", "", "Rate exceeded"),
        ("ThrottlingException", "Query", "", "Rate exceeded"),
        (
            "ProvisionedThroughputExceededException",
            "PutItem",
            " (reached max retries: 9)",
            "The level of configured provisioned throughput for the table was exceeded. Consider increasing your "
            "provisioning level with the UpdateTable API.",
        ),
        ("ConditionalCheckFailedException", "UpdateItem", "", "The conditional request failed"),
        ("AccessDenied", "PutObject", "", "Access Denied"),
        ("NoSuchKey", "GetObject", "", "The specified key does not exist."),
        ("SlowDown", "PutObject", " (reached max retries: 4)", "Please reduce your request rate."),
        ("ExpiredTokenException", "SendMessage", "", "The security token included in the request is expired"),
        (
            "ValidationException",
            "PutItem",
            "",
            "One or more parameter values were invalid: Missing the key order_id in the item",
        ),
    ],
    weight=1.2,
)
cause(
    "py-boto-endpoint",
    "botocore.exceptions.EndpointConnectionError",
    'Could not connect to the endpoint URL: "https://sqs.{region}.amazonaws.com/"',
)
cause(
    "py-gcs-forbidden",
    "google.api_core.exceptions.Forbidden",
    "403 POST https://storage.googleapis.com/upload/storage/v1/b/{bucket}/o?uploadType=multipart: "
    "{user}-svc@acme-prod.iam.gserviceaccount.com does not have storage.objects.create access to the Google Cloud "
    "Storage object. Permission 'storage.objects.create' denied on resource (or it may not exist).",
)
cause("py-pubsub-deadline", "google.api_core.exceptions.DeadlineExceeded", "504 Deadline Exceeded")
cause(
    "py-grpc-unavailable",
    "grpc._channel._InactiveRpcError",
    '<_InactiveRpcError of RPC that terminated with:\n\tstatus = StatusCode.UNAVAILABLE\n\tdetails = "failed to '
    "connect to all addresses; last error: UNKNOWN: ipv4:{ip}:50051: Failed to connect to remote host: Connection "
    'refused"\n\tdebug_error_string = "UNKNOWN:failed to connect to all addresses; last error: UNKNOWN: '
    'ipv4:{ip}:50051: Failed to connect to remote host: Connection refused {{created_time:"{ts}", '
    'grpc_status:14}}"\n>',
)
family(
    "py-stripe-card",
    "stripe.error.CardError",
    "Request req_{hex12}: [V1]",
    [
        "Your card was declined.",
        "Your card has insufficient funds.",
        "Your card has expired.",
        "Your card's security code is incorrect.",
    ],
    weight=1.3,
)
cause(
    "py-stripe-idempotency",
    "stripe.error.IdempotencyError",
    "Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a "
    "key other than '{uuid}' if you meant to execute a different request.",
)
cause(
    "py-smtp-recipient",
    "smtplib.SMTPRecipientsRefused",
    "{{'{email}': (550, b'5.1.1 The email account that you tried to reach does not exist. Please try double-checking "
    "the recipient\\'s email address for typos or unnecessary spaces. {hex12}.{small} - gsmtp')}}",
)
cause(
    "py-smtp-throttled",
    "smtplib.SMTPDataError",
    "(421, b'4.7.0 Try again later, closing connection. (EHLO) {hex12}.{small} - gsmtp')",
)
cause(
    "py-kombu-precondition",
    "amqp.exceptions.PreconditionFailed",
    "Queue.declare: (406) PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{queue}' in vhost '/': "
    "received the value '10000' of type 'signedint' but current is none",
)
cause(
    "py-pika-refused",
    "pika.exceptions.AMQPConnectionError",
    "Connection to {ip}:5672 failed: [Errno 111] Connection refused",
)
family(
    "py-pika-no-exchange",
    "pika.exceptions.ChannelClosedByBroker",
    "(404, \"NOT_FOUND - no exchange '[V1]' in vhost '/'\")",
    ["orders.events", "billing.events"],
)
cause(
    "py-kafka-metadata",
    "kafka.errors.KafkaTimeoutError",
    "KafkaTimeoutError: Failed to update metadata after 60.0 secs.",
)
cause(
    "py-confluent-timeout",
    "confluent_kafka.KafkaException",
    'KafkaError{{code=_MSG_TIMED_OUT,val=-192,str="Local: Message timed out"}}',
)
cause(
    "py-confluent-authz",
    "confluent_kafka.KafkaException",
    'KafkaError{{code=TOPIC_AUTHORIZATION_FAILED,val=29,str="Broker: Topic authorization failed"}}',
)

# Python: application errors (plain words that vary, and look-alikes) --------------------------------------------

family(
    "py-order-address",
    "orders.errors.ShippingError",
    "Order {order} cannot be shipped: address is incomplete (missing [V1])",
    ["postal_code", "street"],
)
cause(
    "py-inventory-reserve",
    "inventory.errors.ReservationFailed",
    "Inventory reservation failed for {sku}: requested {small}, available {small}",
    weight=1.4,
)
family(
    "py-customer-blocked",
    "customers.errors.CustomerBlocked",
    "Customer {cust} is blocked (reason: [V1])",
    ["fraud_suspected", "chargeback_limit", "manual_review"],
)
cause(
    "py-refund-exceeds",
    "payments.errors.RefundError",
    "Refund of {amount} {currency} exceeds captured amount for payment {pay}",
)
family(
    "py-order-transition",
    "orders.errors.InvalidTransition",
    "Cannot transition order {order} from [V1] to [V2]",
    [("shipped", "cancelled"), ("cancelled", "shipped"), ("pending", "delivered")],
)
cause(
    "py-tenant-quota",
    "ratelimit.QuotaExceeded",
    "Tenant {tenant} exceeded its quota of 600 requests per minute",
    weight=1.5,
)
cause("py-user-not-found", "accounts.errors.UserNotFound", "User {user} not found", weight=1.6)
cause("py-user-disabled", "accounts.errors.UserDisabled", "User {user} is disabled")
cause("py-user-mfa", "accounts.errors.AuthError", "user {user} must complete MFA enrolment before API access")
cause(
    "py-project-access",
    "PermissionError",
    "User {user} has no access to project {project}",
)
family(
    "py-publish-rejected",
    "brokers.PublishRejected",
    "publish rejected: queue {queue} [V1]",
    ["full", "paused"],
)
cause(
    "py-geocode",
    "geo.errors.GeocodingError",
    "Could not geocode '{city}, {country}': no results",
)
cause(
    "py-address-free-text",
    "geo.errors.AddressInvalid",
    "Address validation failed: {street} is not a deliverable address",
)
family(
    "py-email-bounce",
    "mailer.Bounce",
    "Email delivery to {email} bounced: [V1]",
    ["mailbox full", "user unknown"],
)
cause(
    "py-moderation",
    "moderation.Rejected",
    "Delivery note rejected by moderation: {freetext}",
    weight=0.7,
)
cause(
    "py-carrier-destination",
    "shipping.errors.NoCarrier",
    "No carrier accepts parcels to {country} over 30 kg",
)
cause(
    "py-currency-unsupported",
    "payments.errors.UnsupportedCurrency",
    "Merchant {tenant} cannot settle in {currency}",
)
cause(
    "py-export-too-large",
    "exports.errors.ExportTooLarge",
    "Export for tenant {tenant} has {big} rows, the limit is 1000000",
)
cause(
    "py-feature-disabled",
    "features.FeatureDisabled",
    "Feature 'bulk_refunds' is disabled for tenant {tenant}",
)
cause(
    "py-region-capacity",
    "cloud.errors.CapacityError",
    "No capacity for instance type m6i.large in region {regionword}",
)
cause(
    "py-queue-consumer",
    "brokers.NoConsumers",
    "queue {queue} has no consumers, message parked after {small} attempts",
)
cause(
    "py-product-out-of-stock",
    "inventory.errors.OutOfStock",
    "'{product}' is out of stock in warehouse {city}",
)

# Python: stack traces (the same type from different places is a different cause) --------------------------------

cause(
    "py-trace-keyerror-discount",
    "KeyError",
    "'{badvalue}'",
    trace=py_trace(
        [
            ("/app/orders/tasks.py", 88, "apply_promotions", "total = pricing.apply_discount(order, code)"),
            ("/app/orders/pricing.py", 41, "apply_discount", "rate = DISCOUNTS[code]"),
        ],
        "KeyError: '{badvalue}'",
    ),
)
cause(
    "py-trace-keyerror-tax",
    "KeyError",
    "'{country}'",
    trace=py_trace(
        [
            ("/app/billing/tasks.py", 120, "build_invoice", "lines = invoice.lines_with_tax(order)"),
            ("/app/billing/invoice.py", 73, "lines_with_tax", "rate = TAX_RATES[order.country]"),
        ],
        "KeyError: '{country}'",
    ),
)
cause(
    "py-trace-none-total",
    "TypeError",
    "unsupported operand type(s) for +: 'NoneType' and 'Decimal'",
    trace=py_trace(
        [
            ("/app/billing/tasks.py", 120, "build_invoice", "invoice.total = invoice.compute_total()"),
            ("/app/billing/invoice.py", 102, "compute_total", "return self.subtotal + self.shipping"),
        ],
        "TypeError: unsupported operand type(s) for +: 'NoneType' and 'Decimal'",
    ),
)
cause(
    "py-trace-none-label",
    "AttributeError",
    "'NoneType' object has no attribute 'address'",
    trace=py_trace(
        [
            ("/app/shipping/tasks.py", 45, "create_label", "pdf = labels.render(shipment)"),
            ("/app/shipping/labels.py", 67, "render", "lines = [shipment.recipient.address.line1]"),
        ],
        "AttributeError: 'NoneType' object has no attribute 'address'",
    ),
)
cause(
    "py-trace-none-notify",
    "AttributeError",
    "'NoneType' object has no attribute 'address'",
    trace=py_trace(
        [
            ("/app/notifications/tasks.py", 30, "send_shipped_email", "mailer.send(build_message(order))"),
            ("/app/notifications/messages.py", 58, "build_message", "to = order.customer.address.email"),
        ],
        "AttributeError: 'NoneType' object has no attribute 'address'",
    ),
)
cause(
    "py-trace-valueerror-qty",
    "ValueError",
    "quantity must be positive, got {small}",
    trace=py_trace(
        [
            ("/app/inventory/consumers.py", 52, "on_stock_event", "apply_adjustment(event)"),
            (
                "/app/inventory/adjust.py",
                19,
                "apply_adjustment",
                "raise ValueError(f'quantity must be positive, got {qty}')",
            ),
        ],
        "ValueError: quantity must be positive, got -{small}",
    ),
)
cause(
    "py-trace-requests-in-sync",
    "requests.exceptions.ConnectionError",
    "('Connection aborted.', RemoteDisconnected('Remote end closed connection without response'))",
    trace=py_trace(
        [
            ("/app/crm/tasks.py", 77, "sync_contact", "client.upsert_contact(contact)"),
            (
                "/app/crm/client.py",
                134,
                "upsert_contact",
                "response = self.session.post(url, json=payload, timeout=10)",
            ),
        ],
        "requests.exceptions.ConnectionError: ('Connection aborted.', RemoteDisconnected('Remote end closed "
        "connection without response'))",
        inner_lib=[
            (
                f"{PY_LIB}/requests/sessions.py",
                637,
                "post",
                'return self.request("POST", url, data=data, json=json, **kwargs)',
            ),
            (f"{PY_LIB}/requests/sessions.py", 589, "request", "resp = self.send(prep, **send_kwargs)"),
            (f"{PY_LIB}/requests/adapters.py", 682, "send", "raise ConnectionError(err, request=request)"),
        ],
    ),
)
cause(
    "py-trace-chained-sync",
    "crm.errors.SyncFailed",
    "could not sync contact {int}",
    trace=py_trace(
        [
            (
                "/app/crm/tasks.py",
                80,
                "sync_contact",
                "raise SyncFailed(f'could not sync contact {contact.id}') from error",
            ),
        ],
        "crm.errors.SyncFailed: could not sync contact {int}",
        cause_block=(
            [
                ("/app/crm/client.py", 140, "fetch_contact", "response.raise_for_status()"),
                (
                    f"{PY_LIB}/requests/models.py",
                    1024,
                    "raise_for_status",
                    "raise HTTPError(http_error_msg, response=self)",
                ),
            ],
            "requests.exceptions.HTTPError: 429 Client Error: Too Many Requests for url: https://api.crm.example/v1/contacts/{int}",
        ),
    ),
)
cause(
    "py-trace-integrity-signup",
    "django.db.utils.IntegrityError",
    'duplicate key value violates unique constraint "accounts_profile_user_id_key"\nDETAIL:  Key (user_id)=({int}) '
    "already exists.",
    trace=py_trace(
        [
            ("/app/accounts/tasks.py", 25, "on_signup", "Profile.objects.create(user=user, locale=locale)"),
        ],
        "django.db.utils.IntegrityError: duplicate key value violates unique constraint "
        '"accounts_profile_user_id_key"\n'
        "DETAIL:  Key (user_id)=({int}) already exists.",
        inner_lib=[
            (
                f"{PY_LIB}/django/db/models/manager.py",
                87,
                "manager_method",
                "return getattr(self.get_queryset(), name)(*args, **kwargs)",
            ),
            (f"{PY_LIB}/django/db/models/query.py", 679, "create", "obj.save(force_insert=True, using=self.db)"),
            (f"{PY_LIB}/django/db/backends/utils.py", 105, "_execute", "return self.cursor.execute(sql, params)"),
        ],
    ),
)
cause(
    "py-trace-index-error",
    "IndexError",
    "list index out of range",
    trace=py_trace(
        [
            ("/app/search/indexer.py", 61, "index_product", "doc = to_document(product)"),
            ("/app/search/documents.py", 33, "to_document", "primary = product.images[0]"),
        ],
        "IndexError: list index out of range",
    ),
)
cause(
    "py-trace-index-error-csv",
    "IndexError",
    "list index out of range",
    trace=py_trace(
        [
            ("/app/imports/tasks.py", 40, "import_file", "for row in parse_rows(path):"),
            ("/app/imports/csvrows.py", 22, "parse_rows", "sku, qty = columns[0], columns[1]"),
        ],
        "IndexError: list index out of range",
    ),
)

# Java and Kotlin ----------------------------------------------------------------------------------------------

LISTENER = (
    "org.springframework.amqp.rabbit.support.ListenerExecutionFailedException: Listener method 'public void "
    "com.acme.[V1].messaging.[V2]Listener.onMessage(com.acme.[V1].messaging.[V2]Event)' threw exception"
)
cause(
    "java-npe-invoice",
    "java.lang.NullPointerException",
    'Cannot invoke "com.acme.billing.Customer.getTaxId()" because "customer" is null',
    trace=java_trace(
        'java.lang.NullPointerException: Cannot invoke "com.acme.billing.Customer.getTaxId()" because "customer" '
        "is null",
        [
            "com.acme.billing.invoice.InvoiceService.buildInvoice(InvoiceService.java:142)",
            "com.acme.billing.messaging.OrderPaidListener.onMessage(OrderPaidListener.java:38)",
            "java.base/jdk.internal.reflect.DirectMethodHandleAccessor.invoke(DirectMethodHandleAccessor.java:103)",
        ],
    ),
)
cause(
    "java-npe-tax",
    "java.lang.NullPointerException",
    'Cannot invoke "java.math.BigDecimal.multiply(java.math.BigDecimal)" because "rate" is null',
    trace=java_trace(
        'java.lang.NullPointerException: Cannot invoke "java.math.BigDecimal.multiply(java.math.BigDecimal)" because '
        '"rate" is null',
        [
            "com.acme.billing.tax.TaxCalculator.compute(TaxCalculator.java:57)",
            "com.acme.billing.invoice.InvoiceService.buildInvoice(InvoiceService.java:151)",
            "com.acme.billing.messaging.OrderPaidListener.onMessage(OrderPaidListener.java:38)",
        ],
    ),
)
cause(
    "java-listener-jackson",
    "org.springframework.amqp.rabbit.support.ListenerExecutionFailedException",
    "Listener method 'public void com.acme.orders.messaging.OrderListener.onMessage(com.acme.orders.messaging."
    "OrderEvent)' threw exception",
    trace=java_trace(
        LISTENER.replace("[V1]", "orders").replace("[V2]", "Order"),
        [],
        caused_by=[
            (
                "com.fasterxml.jackson.databind.exc.InvalidFormatException: Cannot deserialize value of type "
                '`java.time.Instant` from String "{badvalue}"',
                [
                    "com.fasterxml.jackson.databind.exc.InvalidFormatException.from(InvalidFormatException.java:67)",
                    "com.fasterxml.jackson.databind.ObjectMapper.readValue(ObjectMapper.java:3807)",
                    "com.acme.orders.messaging.OrderEventReader.read(OrderEventReader.java:29)",
                    "com.acme.orders.messaging.OrderListener.onMessage(OrderListener.java:44)",
                ],
            )
        ],
    ),
)
cause(
    "java-listener-stock",
    "org.springframework.amqp.rabbit.support.ListenerExecutionFailedException",
    "Listener method 'public void com.acme.inventory.messaging.StockListener.onMessage(com.acme.inventory.messaging."
    "StockEvent)' threw exception",
    trace=java_trace(
        LISTENER.replace("[V1]", "inventory").replace("[V2]", "Stock"),
        [],
        caused_by=[
            (
                "java.lang.IllegalStateException: reservation {uuid} already released",
                [
                    "com.acme.inventory.reservation.Reservation.release(Reservation.java:88)",
                    "com.acme.inventory.reservation.ReservationService.cancel(ReservationService.java:131)",
                    "com.acme.inventory.messaging.StockListener.onMessage(StockListener.java:52)",
                ],
            )
        ],
    ),
)
cause(
    "java-kotlin-required",
    "java.lang.IllegalStateException",
    "Required value was null.",
    trace=java_trace(
        "java.lang.IllegalStateException: Required value was null.",
        [
            "com.acme.loyalty.points.PointsCalculator.calculate(PointsCalculator.kt:41)",
            "com.acme.loyalty.points.PointsService.award(PointsService.kt:73)",
            "com.acme.loyalty.messaging.PurchaseConsumer.consume(PurchaseConsumer.kt:29)",
        ],
    ),
)
cause(
    "java-optimistic-lock",
    "org.springframework.orm.ObjectOptimisticLockingFailureException",
    "Row was updated or deleted by another transaction (or unsaved-value mapping was incorrect) : "
    "[com.acme.inventory.StockItem#{int}]",
    trace=java_trace(
        "org.springframework.orm.ObjectOptimisticLockingFailureException: Row was updated or deleted by another "
        "transaction (or unsaved-value mapping was incorrect) : [com.acme.inventory.StockItem#{int}]",
        [
            "org.springframework.orm.jpa.vendor.HibernateJpaDialect.convertHibernateAccessException("
            "HibernateJpaDialect.java:325)",
            "com.acme.inventory.stock.StockService.adjust(StockService.java:96)",
            "com.acme.inventory.messaging.StockListener.onMessage(StockListener.java:47)",
        ],
        caused_by=[
            (
                "org.hibernate.StaleObjectStateException: Row was updated or deleted by another transaction (or "
                "unsaved-value mapping was incorrect) : [com.acme.inventory.StockItem#{int}]",
                [
                    "org.hibernate.event.internal.DefaultMergeEventListener.entityIsDetached("
                    "DefaultMergeEventListener.java:417)",
                ],
            )
        ],
    ),
)
cause(
    "java-hikari",
    "java.sql.SQLTransientConnectionException",
    "HikariPool-1 - Connection is not available, request timed out after {ms}ms (total={small}, active={small}, "
    "idle=0, waiting={small})",
)
cause(
    "java-pg-statement-timeout",
    "org.postgresql.util.PSQLException",
    'ERROR: canceling statement due to statement timeout\n  Where: SQL statement "UPDATE stock SET reserved = '
    "reserved + {small} WHERE sku = '{sku}'\"",
)
cause(
    "java-pg-duplicate-idempotency",
    "org.postgresql.util.PSQLException",
    'ERROR: duplicate key value violates unique constraint "payments_idempotency_key_key"\n  Detail: Key '
    "(idempotency_key)=({uuid}) already exists.",
)
cause(
    "java-data-integrity",
    "org.springframework.dao.DataIntegrityViolationException",
    "could not execute statement; SQL [n/a]; constraint [uk_customer_email]; nested exception is "
    "org.hibernate.exception.ConstraintViolationException: could not execute statement",
)
family(
    "java-webclient",
    "org.springframework.web.reactive.function.client.WebClientResponseException",
    "[V1] from [V2] http://[V3]/api/v1/[V4]",
    [
        ("503 Service Unavailable", "POST", "pricing-service", "quotes"),
        ("500 Internal Server Error", "POST", "pricing-service", "quotes"),
        ("503 Service Unavailable", "GET", "catalog-service", "products/{sku}"),
    ],
)
family(
    "java-resttemplate-timeout",
    "org.springframework.web.client.ResourceAccessException",
    'I/O error on POST request for "http://[V1]:8080/v1/[V2]": Read timed out; nested exception is '
    "java.net.SocketTimeoutException: Read timed out",
    [("fraud-check", "score"), ("loyalty-service", "accruals")],
)
cause(
    "java-feign-inventory",
    "feign.FeignException$ServiceUnavailable",
    "[503 Service Unavailable] during [GET] to [http://inventory/api/stock/{sku}] [InventoryClient#getStock(String)]: "
    "[no healthy upstream]",
)
cause(
    "java-kafka-expiring",
    "org.apache.kafka.common.errors.TimeoutException",
    "Expiring {small} record(s) for orders-{small}:120000 ms has passed since batch creation",
)
cause(
    "java-enum",
    "java.lang.IllegalArgumentException",
    "No enum constant com.acme.orders.Channel.{badvalue}",
)
family(
    "java-bean-validation",
    "org.springframework.web.bind.MethodArgumentNotValidException",
    "Validation failed for argument [0] in public void com.acme.orders.api.OrderController.create(com.acme.orders.api."
    "CreateOrder): [Field error in object 'createOrder' on field '[V1]': rejected value [[V2]]; codes "
    "[[V3].createOrder.[V1],[V3].[V1],[V3].java.lang.String,[V3]]; arguments "
    "[org.springframework.context.support.DefaultMessageSourceResolvable: codes [createOrder.[V1],[V1]]; arguments []; "
    "default message [[V1]]]; default message [[V4]]]",
    [
        ("email", "{badvalue}", "Email", "must be a well-formed email address"),
        ("customerName", "", "NotBlank", "must not be blank"),
    ],
)
cause(
    "java-ssl-pkix",
    "javax.net.ssl.SSLHandshakeException",
    "PKIX path building failed: sun.security.provider.certpath.SunCertPathBuilderException: unable to find valid "
    "certification path to requested target",
)
family(
    "java-unknown-host",
    "java.net.UnknownHostException",
    "[V1]: Name or service not known",
    ["ledger-service.payments.svc.cluster.local", "fx-rates.payments.svc.cluster.local"],
)
cause("java-connect-refused", "java.net.ConnectException", "Connection refused (Connection refused)")
cause(
    "java-aws-sqs-throttle",
    "software.amazon.awssdk.services.sqs.model.SqsException",
    "Rate exceeded (Service: Sqs, Status Code: 400, Request ID: {uuid})",
)
cause(
    "java-aws-sqs-missing",
    "software.amazon.awssdk.services.sqs.model.QueueDoesNotExistException",
    "The specified queue does not exist. (Service: Sqs, Status Code: 400, Request ID: {uuid})",
)
cause(
    "java-aws-dynamo-condition",
    "software.amazon.awssdk.services.dynamodb.model.ConditionalCheckFailedException",
    "The conditional request failed (Service: DynamoDb, Status Code: 400, Request ID: {reqid})",
)
family(
    "java-circuit-open",
    "io.github.resilience4j.circuitbreaker.CallNotPermittedException",
    "CircuitBreaker '[V1]' is OPEN and does not permit further calls",
    ["pricing", "inventory"],
)
cause(
    "java-reactor-timeout",
    "java.util.concurrent.TimeoutException",
    "Did not observe any item or terminal signal within {ms}ms in 'flatMap' (and no fallback has been configured)",
)
cause(
    "java-retry-exhausted",
    "org.springframework.amqp.AmqpRejectAndDontRequeueException",
    "Retry Policy Exhausted",
)
cause(
    "java-message-conversion",
    "org.springframework.amqp.support.converter.MessageConversionException",
    'Failed to convert Message content: \'{{"orderId":"{order}","amount":{amount},"currency":"{currency}"}}\' '
    "to type 'com.acme.orders.messaging.OrderEvent'",
)
cause(
    "java-jackson-unrecognized",
    "com.fasterxml.jackson.databind.exc.UnrecognizedPropertyException",
    'Unrecognized field "couponCode" (class com.acme.events.OrderPlaced), not marked as ignorable (12 known '
    'properties: "id", "customerId", "lines", "total", "currency", "placedAt", "channel", "shipping", "billing", '
    '"notes", "tags", "version"])\n at [Source: (byte[])"{{"id":"{order}","couponCode":"{hex8}"}}"; line: 1, '
    'column: {col}] (through reference chain: com.acme.events.OrderPlaced["couponCode"])',
)
cause(
    "java-date-parse",
    "java.time.format.DateTimeParseException",
    "Text '{badvalue}' could not be parsed at index 0",
)
cause(
    "java-oom",
    "java.lang.OutOfMemoryError",
    "Java heap space",
    weight=0.5,
)
cause(
    "java-class-cast",
    "java.lang.ClassCastException",
    "class java.lang.String cannot be cast to class java.lang.Long (java.lang.String and java.lang.Long are in "
    "module java.base of loader 'bootstrap')",
    trace=java_trace(
        "java.lang.ClassCastException: class java.lang.String cannot be cast to class java.lang.Long (java.lang.String "
        "and java.lang.Long are in module java.base of loader 'bootstrap')",
        [
            "com.acme.shipping.rates.RateCard.lookup(RateCard.java:64)",
            "com.acme.shipping.rates.RateService.quote(RateService.java:40)",
            "com.acme.shipping.messaging.QuoteRequestListener.onMessage(QuoteRequestListener.java:31)",
        ],
    ),
)

# Go --------------------------------------------------------------------------------------------------------------

cause("go-pg-refused", "", "dial tcp {ip}:5432: connect: connection refused", weight=1.4)
family(
    "go-dns",
    "",
    "dial tcp: lookup [V1] on 10.96.0.10:53: no such host",
    ["billing.internal", "ledger.internal"],
)
cause("go-deadline", "", "context deadline exceeded", weight=1.2)
cause("go-canceled", "", "context canceled", weight=0.6)
family(
    "go-client-timeout",
    "",
    'Post "http://[V1]:8080/v1/[V2]": context deadline exceeded (Client.Timeout exceeded while awaiting headers)',
    [("ledger.internal", "entries"), ("fx-rates.internal", "quotes")],
)
cause("go-reset", "", "read tcp {ip}:{port}->{ip}:443: read: connection reset by peer")
cause("go-pq-duplicate", "", 'pq: duplicate key value violates unique constraint "shipments_tracking_number_key"')
cause("go-pq-serialize", "", "pq: could not serialize access due to concurrent update")
cause("go-no-rows", "", "sql: no rows in result set")
family(
    "go-json-unmarshal",
    "",
    "json: cannot unmarshal [V1] into Go struct field [V2] of type [V3]",
    [("string", "Order.items.quantity", "int"), ("number", "Order.customer.id", "string")],
)
cause("go-json-invalid-char", "", "invalid character '{char}' looking for beginning of value")
cause(
    "go-grpc-unavailable",
    "",
    'rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: dial tcp '
    '{ip}:50051: connect: connection refused"',
)
cause("go-grpc-deadline", "", "rpc error: code = DeadlineExceeded desc = context deadline exceeded")
cause("go-grpc-notfound", "", "rpc error: code = NotFound desc = sku {sku} not found")
cause("go-redis-pool", "", "redis: connection pool timeout")
cause("go-io-timeout", "", "dial tcp: i/o timeout")
cause("go-amqp-closed", "", 'Exception (504) Reason: "channel/connection is not open"')
cause(
    "go-amqp-too-large",
    "",
    'Exception (406) Reason: "PRECONDITION_FAILED - message size {big} is larger than configured max size 134217728"',
)
cause(
    "go-s3-denied",
    "",
    "operation error S3: PutObject, https response error StatusCode: 403, RequestID: {awsreq}, HostID: {b64}, api "
    "error AccessDenied: Access Denied",
)
cause(
    "go-dynamo-throttle",
    "",
    "operation error DynamoDB: PutItem, exceeded maximum number of attempts, 3, https response error StatusCode: 400, "
    "RequestID: {reqid}, api error ThrottlingException: Rate exceeded.",
)
cause(
    "go-kafka-brokers",
    "",
    "kafka: client has run out of available brokers to talk to: dial tcp {ip}:9092: connect: connection refused",
)
cause("go-x509-unknown", "", "x509: certificate signed by unknown authority")
cause(
    "go-x509-expired",
    "",
    "x509: certificate has expired or is not yet valid: current time {ts} is after 2026-10-01T00:00:00Z",
)
family(
    "go-payment-wrapped",
    "",
    "failed to process order {order}: charge {pay}: [V1]",
    ["insufficient funds", "card expired", "do not honor"],
)
cause(
    "go-panic-nil-label",
    "",
    "runtime error: invalid memory address or nil pointer dereference",
    trace=go_trace(
        "panic: runtime error: invalid memory address or nil pointer dereference\n[signal SIGSEGV: segmentation "
        "violation code=0x1 addr=0x{hex2} pc=0x{hex8}]",
        [
            ("github.com/acme/shipping/internal/label.(*Printer).Render", "/src/internal/label/printer.go:88"),
            ("github.com/acme/shipping/internal/worker.(*Worker).handle", "/src/internal/worker/worker.go:142"),
            (
                "github.com/rabbitmq/amqp091-go.(*Channel).dispatch",
                "/go/pkg/mod/github.com/rabbitmq/amqp091-go@v1.10.0/channel.go:352",
            ),
        ],
    ),
)
cause(
    "go-panic-index-split",
    "",
    "runtime error: index out of range [{small}] with length {small}",
    trace=go_trace(
        "panic: runtime error: index out of range [{small}] with length {small}",
        [
            ("github.com/acme/shipping/internal/parcel.Split", "/src/internal/parcel/split.go:57"),
            ("github.com/acme/shipping/internal/worker.(*Worker).handle", "/src/internal/worker/worker.go:150"),
            (
                "github.com/rabbitmq/amqp091-go.(*Channel).dispatch",
                "/go/pkg/mod/github.com/rabbitmq/amqp091-go@v1.10.0/channel.go:352",
            ),
        ],
    ),
)
cause(
    "go-panic-nil-rates",
    "",
    "runtime error: invalid memory address or nil pointer dereference",
    trace=go_trace(
        "panic: runtime error: invalid memory address or nil pointer dereference\n[signal SIGSEGV: segmentation "
        "violation code=0x1 addr=0x{hex2} pc=0x{hex8}]",
        [
            ("github.com/acme/shipping/internal/rates.(*Table).Lookup", "/src/internal/rates/table.go:33"),
            ("github.com/acme/shipping/internal/rates.Quote", "/src/internal/rates/quote.go:71"),
            ("net/http.HandlerFunc.ServeHTTP", "/usr/local/go/src/net/http/server.go:2166"),
        ],
    ),
)

# Node ------------------------------------------------------------------------------------------------------------

family(
    "node-axios-status",
    "AxiosError",
    "Request failed with status code [V1]",
    ["404", "500", "502", "503"],
    weight=1.4,
)
cause("node-axios-timeout", "AxiosError", "timeout of {ms}ms exceeded")
cause("node-redis-refused", "Error", "connect ECONNREFUSED {ip}:6379")
family(
    "node-enotfound",
    "Error",
    "getaddrinfo ENOTFOUND [V1]",
    ["search-api.internal", "recommendations.internal"],
)
cause("node-etimedout", "Error", "connect ETIMEDOUT {ip}:443")
cause("node-socket-hang-up", "Error", "socket hang up")
cause("node-json-html", "SyntaxError", "Unexpected token '<', \"<!DOCTYPE \"... is not valid JSON")
cause("node-json-end", "SyntaxError", "Unexpected end of JSON input")
family(
    "node-mongoose",
    "ValidationError",
    "Order validation failed: [V1]: Path `[V1]` is required.",
    ["shippingAddress.zip", "customer.email"],
)
cause(
    "node-sequelize-fk",
    "SequelizeForeignKeyConstraintError",
    'insert or update on table "line_items" violates foreign key constraint "line_items_order_id_fkey"',
)
cause(
    "node-ioredis",
    "MaxRetriesPerRequestError",
    'Reached the max retries per request limit (which is 20). Refer to "maxRetriesPerRequest" option for details.',
)
cause(
    "node-amqplib-tag",
    "Error",
    'Channel closed by server: 406 (PRECONDITION-FAILED) with message "PRECONDITION_FAILED - unknown delivery tag '
    '{int}"',
)
cause(
    "node-prisma-unique",
    "PrismaClientKnownRequestError",
    "\nInvalid `prisma.order.create()` invocation:\n\n\nUnique constraint failed on the fields: (`external_id`)",
)
family(
    "node-zod",
    "ZodError",
    '[\n  {\n    "code": "invalid_type",\n    "expected": "string",\n    "received": "undefined",\n    "path": [\n'
    '      "customer",\n      "[V1]"\n    ],\n    "message": "Required"\n  }\n]',
    ["email", "phone"],
)
cause("node-stripe-no-customer", "StripeInvalidRequestError", "No such customer: '{cust}'")
cause("node-aws-expired", "ExpiredTokenException", "The provided token has expired.")
cause("node-aws-throttle", "ThrottlingException", "Rate exceeded")
cause("node-body-limit", "AxiosError", "Request body larger than maxBodyLength limit")
cause(
    "node-mongo-dup",
    "MongoServerError",
    'E11000 duplicate key error collection: crm.contacts index: email_1 dup key: {{ email: "{email}" }}',
)
cause("node-kafkajs-authz", "KafkaJSProtocolError", "Topic authorization failed")
cause(
    "node-trace-undefined-sku",
    "TypeError",
    "Cannot read properties of undefined (reading 'sku')",
    trace=node_trace(
        "TypeError: Cannot read properties of undefined (reading 'sku')",
        [
            ("mapLineItem", "/app/src/orders/mapper.js:42"),
            ("Array.map", "<anonymous>:0"),
            ("toWarehouseOrder", "/app/src/orders/mapper.js:18"),
            ("handleMessage", "/app/src/consumer.js:77"),
            ("Channel.emit", "/app/node_modules/amqplib/lib/channel.js:480"),
        ],
    ),
)
cause(
    "node-trace-undefined-price",
    "TypeError",
    "Cannot read properties of undefined (reading 'amount')",
    trace=node_trace(
        "TypeError: Cannot read properties of undefined (reading 'amount')",
        [
            ("totalFor", "/app/src/pricing/totals.js:23"),
            ("buildQuote", "/app/src/pricing/quote.js:61"),
            ("handleMessage", "/app/src/consumer.js:77"),
            ("Channel.emit", "/app/node_modules/amqplib/lib/channel.js:480"),
        ],
    ),
)
cause(
    "node-trace-undefined-sku-search",
    "TypeError",
    "Cannot read properties of undefined (reading 'sku')",
    trace=node_trace(
        "TypeError: Cannot read properties of undefined (reading 'sku')",
        [
            ("toSearchDocument", "/app/src/search/documents.js:15"),
            ("indexBatch", "/app/src/search/indexer.js:88"),
            ("runMicrotasks", "<anonymous>:0"),
        ],
    ),
)
cause(
    "node-trace-range",
    "RangeError",
    "Invalid time value",
    trace=node_trace(
        "RangeError: Invalid time value",
        [
            ("Date.toISOString", "<anonymous>:0"),
            ("formatDeliveryWindow", "/app/src/shipping/format.js:12"),
            ("buildNotification", "/app/src/notifications/build.js:40"),
            ("processTicksAndRejections", "node:internal/process/task_queues:95"),
        ],
    ),
)

# .NET (MassTransit and NServiceBus consumers) ------------------------------------------------------------------

cause(
    "dotnet-nre-orders",
    "System.NullReferenceException",
    "Object reference not set to an instance of an object.",
    trace=dotnet_trace(
        "System.NullReferenceException: Object reference not set to an instance of an object.",
        [
            (
                "Acme.Orders.Handlers.OrderPlacedHandler.Handle(OrderPlaced message, IMessageHandlerContext context)",
                "/src/Acme.Orders/Handlers/OrderPlacedHandler.cs:48",
            ),
            ("NServiceBus.InvokeHandlerTerminator.Terminate(IInvokeHandlerContext context)", None),
        ],
    ),
)
cause(
    "dotnet-nre-billing",
    "System.NullReferenceException",
    "Object reference not set to an instance of an object.",
    trace=dotnet_trace(
        "System.NullReferenceException: Object reference not set to an instance of an object.",
        [
            ("Acme.Billing.InvoiceBuilder.Build(Order order)", "/src/Acme.Billing/InvoiceBuilder.cs:91"),
            (
                "Acme.Billing.Consumers.OrderPaidConsumer.Consume(ConsumeContext`1 context)",
                "/src/Acme.Billing/Consumers/OrderPaidConsumer.cs:27",
            ),
        ],
    ),
)
cause(
    "dotnet-sequence-empty",
    "System.InvalidOperationException",
    "Sequence contains no elements",
    trace=dotnet_trace(
        "System.InvalidOperationException: Sequence contains no elements",
        [
            ("System.Linq.ThrowHelper.ThrowNoElementsException()", None),
            ("System.Linq.Enumerable.First[TSource](IEnumerable`1 source)", None),
            ("Acme.Shipping.RateSelector.Cheapest(IReadOnlyList`1 rates)", "/src/Acme.Shipping/RateSelector.cs:22"),
            (
                "Acme.Shipping.Consumers.QuoteConsumer.Consume(ConsumeContext`1 context)",
                "/src/Acme.Shipping/Consumers/QuoteConsumer.cs:35",
            ),
        ],
    ),
)
cause("dotnet-timeout", "System.TimeoutException", "The operation has timed out.")
cause(
    "dotnet-sql-connect",
    "Microsoft.Data.SqlClient.SqlException",
    "A network-related or instance-specific error occurred while establishing a connection to SQL Server. The server "
    "was not found or was not accessible. Verify that the instance name is correct and that SQL Server is configured "
    "to allow remote connections. (provider: TCP Provider, error: 40 - Could not open a connection to SQL Server)",
)
cause(
    "dotnet-sql-pk",
    "Microsoft.Data.SqlClient.SqlException",
    "Violation of PRIMARY KEY constraint 'PK_Orders'. Cannot insert duplicate key in object 'dbo.Orders'. The "
    "duplicate key value is ({int}).\nThe statement has been terminated.",
)
family(
    "dotnet-http-status",
    "System.Net.Http.HttpRequestException",
    "Response status code does not indicate success: [V1].",
    ["503 (Service Unavailable)", "500 (Internal Server Error)", "429 (Too Many Requests)"],
)
cause("dotnet-format", "System.FormatException", "Input string was not in a correct format.")
cause(
    "dotnet-masstransit-timeout",
    "MassTransit.RequestTimeoutException",
    "Timeout waiting for response, RequestId: {uuid}",
)


# New causes ------------------------------------------------------------------------------------------------------
#
# Generated after the causes above, from a seed of their own, and written after their rows: adding them left every
# row above as it was. {=name} in a template or a trace stands for one value of the cause's own short list
# picks[name], drawn for each message and the same in its message and its trace; a pick named "a|b" draws linked
# values "x|y" for {=a} and {=b}. {=message} in a trace is the message itself. Two kinds:
# - one cause whose messages differ in a word or a few from a short list: a quoted identifier, a field name, an enum
#   constant, a host in a TLS error, a subject or topic, XML element names, a value with spaces inside a URL, the
#   first word, a run of several tokens;
# - look-alike causes: the same exception type from the same frames with another message, a refused or timed-out
#   connection to another service (another host or port), the same request failing with another HTTP status.

NEW_SEED = 20270301
NEW_CAUSES: list[Cause] = []
NEW_MIN_PICKED = 8  # messages of a cause with picks, at least, so that several of its values show


def new_cause(
    cid: str,
    error_type: str,
    template: str,
    *,
    family_id: str | None = None,
    picks: dict[str, list[str]] | None = None,
    trace: Callable[[R], str] | None = None,
    weight: float = 1.0,
) -> None:
    NEW_CAUSES.append(Cause(cid, family_id or cid, error_type, template, trace, weight, picks=picks or {}))


def new_family(
    fid: str,
    error_type: str,
    template: str,
    variants: list[tuple[str, ...] | str],
    *,
    picks: dict[str, list[str]] | None = None,
    weight: float = 1.0,
) -> None:
    """Look-alike causes among the new ones, as family() makes them."""
    for slug, kind, text in _variants(error_type, template, variants):
        new_cause(f"{fid}:{slug}", kind, text, family_id=fid, picks=picks, weight=weight)


# One cause, a quoted (or dotted) identifier from a short list ------------------------------------------------------

new_cause(
    "py-django-no-reverse",
    "django.urls.exceptions.NoReverseMatch",
    "Reverse for '{=view}' not found. '{=view}' is not a valid view function or pattern name.",
    picks={"view": ["order-detail", "invoice-pdf", "newsletter-unsubscribe", "parcel-tracking", "account-settings"]},
)
new_cause(
    "py-dispatch-unknown-kind",
    "dispatch.errors.NoConsumer",
    "no consumer bound for message kind '{=kind}' (routing table rev {small})",
    picks={
        "kind": [
            "invoice.voided",
            "customer.merged",
            "parcel.rerouted",
            "subscription.paused",
            "refund.partially_settled",
        ]
    },
    weight=1.3,
)
new_cause(
    "php-messenger-no-handler",
    "Symfony\\Component\\Messenger\\Exception\\NoHandlerForMessageException",
    'No handler for message "App\\Message\\{=msg}".',
    picks={"msg": ["SendInvoiceReminder", "SyncCustomerToCrm", "RebuildSearchIndex", "ExpireAbandonedCart"]},
)
new_cause(
    "go-template-undefined",
    "",
    'render mail {uuid}: template: no template "{=tpl}" associated with template "mail"',
    picks={"tpl": ["receipt_de", "receipt_fr", "shipping_notice_it", "refund_es", "welcome_pl", "dunning_nl"]},
)
new_cause(
    "dotnet-locale-missing",
    "System.Collections.Generic.KeyNotFoundException",
    "The given key '{=locale}' was not present in the dictionary.",
    picks={"locale": ["de-AT", "fr-BE", "pt-BR", "es-MX", "nl-BE", "it-CH"]},
    trace=dotnet_trace(
        "System.Collections.Generic.KeyNotFoundException: {=message}",
        [
            ("System.Collections.Generic.Dictionary`2.get_Item(TKey key)", None),
            (
                "Acme.Notifications.Localization.TemplateCatalog.For(String locale)",
                "/src/Acme.Notifications/Localization/TemplateCatalog.cs:44",
            ),
            (
                "Acme.Notifications.Consumers.OrderShippedConsumer.Consume(ConsumeContext`1 context)",
                "/src/Acme.Notifications/Consumers/OrderShippedConsumer.cs:31",
            ),
        ],
    ),
)
new_cause(
    "node-handlebars-partial",
    "Error",
    "The partial {=partial} could not be found",
    picks={"partial": ["orderSummary", "shippingBlock", "legalFooter", "promoBanner", "loyaltyTeaser"]},
)
new_cause(
    "rust-tera-template",
    "tera::Error",
    "Template '{=tpl}' not found",
    picks={
        "tpl": [
            "invoices/credit_note.html",
            "invoices/proforma.html",
            "mail/payment_failed.txt",
            "mail/refund_issued.txt",
        ]
    },
)
new_cause(
    "java-spring-no-bean",
    "org.springframework.beans.factory.NoSuchBeanDefinitionException",
    "No bean named '{=bean}' available",
    picks={"bean": ["postnordCarrierAdapter", "inpostCarrierAdapter", "brtCarrierAdapter", "glsCarrierAdapter"]},
)
new_cause(
    "ruby-i18n-missing",
    "I18n::MissingTranslationData",
    "Translation missing: {=key}",
    picks={
        "key": [
            "pl.mailers.order_shipped.subject",
            "cs.mailers.order_shipped.subject",
            "ro.mailers.order_shipped.subject",
            "hu.mailers.order_shipped.subject",
        ]
    },
)

# One cause, a field or property name from a short list --------------------------------------------------------

new_cause(
    "java-jackson-unrecognized-scan",
    "com.fasterxml.jackson.databind.exc.UnrecognizedPropertyException",
    'Unrecognized field "{=field}" (class com.acme.tracking.events.ParcelScanned), not marked as ignorable (7 known '
    'properties: "parcelId", "scannedAt", "hub", "status", "carrier", "weightGrams", "version"])\n at [Source: '
    "REDACTED (`StreamReadFeature.INCLUDE_SOURCE_IN_LOCATION` disabled); line: 1, column: {col}] (through reference "
    'chain: com.acme.tracking.events.ParcelScanned["{=field}"])',
    picks={"field": ["scanLocation", "handlerBadge", "gateCode", "sortLane", "legacyRef"]},
    weight=1.3,
)
new_cause(
    "py-pydantic-meta-type",
    "pydantic_core._pydantic_core.ValidationError",
    "1 validation error for RefundRequested\n{=loc}\n  Input should be a valid string [type=string_type, "
    "input_value={int}, input_type=int]\n    For further information visit "
    "https://errors.pydantic.dev/2.9/v/string_type",
    picks={"loc": ["body.meta.source", "body.meta.channel", "body.meta.locale", "body.meta.origin_system"]},
)
new_cause(
    "ruby-record-invalid-geo",
    "ActiveRecord::RecordInvalid",
    "Validation failed: {=attr} can't be blank",
    picks={"attr": ["Shipping zone", "Tax region", "Billing country", "Delivery window"]},
)
new_cause(
    "dotnet-json-unmapped",
    "System.Text.Json.JsonException",
    "The JSON property '{=prop}' could not be mapped to any .NET member contained in type "
    "'Acme.Catalog.Contracts.ProductUpdated'. Path: $.{=prop} | LineNumber: 0 | BytePositionInLine: {col}.",
    picks={"prop": ["colour", "sizeChart", "careInstructions", "countryOfOrigin", "hsCode"]},
)
new_cause(
    "go-validator-signup",
    "",
    "Key: 'SignupRequest.{=f}' Error:Field validation for '{=f}' failed on the 'required' tag",
    picks={"f": ["Email", "Locale", "Consent", "Country"]},
)
new_cause(
    "node-joi-tracking-params",
    "ValidationError",
    '"{=key}" is not allowed',
    picks={"key": ["utm_source", "utm_medium", "utm_campaign", "gclid", "fbclid"]},
    weight=1.2,
)
new_cause(
    "php-laravel-b2b-required",
    "Illuminate\\Validation\\ValidationException",
    "The {=field} field is required.",
    picks={"field": ["billing country", "vat number", "postal code", "company name"]},
)

# One cause, an enum constant from a short list ------------------------------------------------------------------

new_cause(
    "java-enum-payment-method",
    "java.lang.IllegalArgumentException",
    "No enum constant com.acme.payments.PaymentMethod.{=v}",
    picks={"v": ["BLIK", "IDEAL", "SOFORT", "BANCONTACT", "PIX"]},
    trace=java_trace(
        "java.lang.IllegalArgumentException: {=message}",
        [
            "java.base/java.lang.Enum.valueOf(Enum.java:293)",
            "com.acme.payments.PaymentMethod.valueOf(PaymentMethod.java:5)",
            "com.acme.payments.messaging.ChargeRequestedListener.onMessage(ChargeRequestedListener.java:41)",
        ],
    ),
)
new_cause(
    "rust-serde-unknown-variant",
    "serde_json::Error",
    "unknown variant `{=v}`, expected one of `standard`, `express`, `economy` at line 1 column {col}",
    picks={"v": ["same_day", "overnight", "locker", "pickup_point"]},
)
new_cause(
    "java-jackson-enum-status",
    "com.fasterxml.jackson.databind.exc.InvalidFormatException",
    'Cannot deserialize value of type `com.acme.fulfilment.FulfilmentStatus` from String "{=v}": not one of the '
    "values accepted for Enum class: [PICKED, PACKED, SHIPPED, DELIVERED]\n at [Source: REDACTED "
    "(`StreamReadFeature.INCLUDE_SOURCE_IN_LOCATION` disabled); line: 1, column: {col}] (through reference chain: "
    'com.acme.fulfilment.events.FulfilmentChanged["status"])',
    picks={"v": ["PARTIALLY_SHIPPED", "ON_HOLD", "BACKORDERED", "RETURNED"]},
)
new_cause(
    "py-enum-order-channel",
    "ValueError",
    "'{=v}' is not a valid OrderChannel",
    picks={"v": ["tiktok", "whatsapp", "kiosk", "marketplace", "call_centre"]},
)
new_cause(
    "go-protojson-enum",
    "",
    'decode ticket event: proto: (line 1:{col}): invalid value for enum field priority: "{=v}"',
    picks={"v": ["URGENT", "BLOCKER", "P0", "TRIVIAL"]},
)
new_cause(
    "ts-zod-payment-method",
    "ZodError",
    '[\n  {{\n    "received": "{=v}",\n    "code": "invalid_enum_value",\n    "options": [\n      "card",\n'
    '      "paypal",\n      "klarna"\n    ],\n    "path": [\n      "payment",\n      "method"\n    ],\n'
    "    \"message\": \"Invalid enum value. Expected 'card' | 'paypal' | 'klarna', received '{=v}'\"\n  }}\n]",
    picks={"v": ["applepay", "googlepay", "sepa_debit", "ideal"]},
)
new_cause(
    "php-enum-shipping-speed",
    "ValueError",
    '"{=v}" is not a valid backing value for enum App\\Enums\\ShippingSpeed',
    picks={"v": ["express_plus", "next_day_am", "saturday", "freight"]},
)

# One cause, a host name in a TLS error ---------------------------------------------------------------------------

new_cause(
    "py-ssl-corp-issuer",
    "requests.exceptions.SSLError",
    "HTTPSConnectionPool(host='{=host}', port=443): Max retries exceeded with url: {=path}{int} (Caused by "
    "SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get "
    "local issuer certificate (_ssl.c:1006)')))",
    picks={
        "host|path": [
            "ledger.corp.acme.net|/api/v2/entries/",
            "hr-api.corp.acme.net|/v1/employees/",
            "sso.corp.acme.net|/oauth/introspect?token_id=",
            "erp-gateway.corp.acme.net|/sap/orders/",
        ]
    },
    weight=1.3,
)
new_cause(
    "go-x509-wrong-name",
    "",
    'Post "https://{=host}/v2/events": tls: failed to verify certificate: x509: certificate is valid for '
    "*.acme.internal, acme.internal, not {=host}",
    picks={"host": ["events.eu.acme.internal", "events.us.acme.internal", "events.apac.acme.internal"]},
)
new_cause(
    "java-ssl-no-san",
    "javax.net.ssl.SSLHandshakeException",
    "No subject alternative DNS name matching {=host} found.",
    picks={
        "host": [
            "orders.api.acme-shop.eu",
            "billing.api.acme-shop.eu",
            "auth.api.acme-shop.eu",
            "media.api.acme-shop.eu",
        ]
    },
)
new_cause(
    "node-tls-altnames",
    "Error",
    "Hostname/IP does not match certificate's altnames: Host: {=host}. is not in the cert's altnames: "
    "DNS:*.cdn.acme-static.net, DNS:acme-static.net",
    picks={"host": ["img.eu.cdn.acme-static.net", "img.us.cdn.acme-static.net", "fonts.eu.cdn.acme-static.net"]},
)
new_cause(
    "php-curl-issuer",
    "GuzzleHttp\\Exception\\RequestException",
    "cURL error 60: SSL certificate problem: unable to get local issuer certificate (see "
    "https://curl.haxx.se/libcurl/c/libcurl-errors.html) for https://{=host}/api/v3/orders?page={small}",
    picks={"host": ["api.marketplace-one.example", "seller.bazaar.example", "feeds.shopline.example"]},
)

# One cause, a subject, topic, exchange or queue from a short list ----------------------------------------------

new_cause(
    "go-jetstream-no-response",
    "",
    'jetstream publish to "{=subj}": nats: no response from stream',
    picks={"subj": ["orders.eu.created", "orders.us.created", "stock.eu.reserved", "parcels.dispatched.eu"]},
    weight=1.3,
)
new_cause(
    "java-kafka-topic-authz",
    "org.apache.kafka.common.errors.TopicAuthorizationException",
    "Not authorized to access topics: [{=topic}]",
    picks={"topic": ["payments.settled.v2", "payments.refunded.v2", "payments.disputed.v1", "payments.chargeback.v1"]},
)
new_cause(
    "py-confluent-unknown-topic",
    "cimpl.KafkaException",
    'KafkaError{{code=UNKNOWN_TOPIC_OR_PART,val=3,str="Subscribed topic not available: {=topic}: Broker: Unknown '
    'topic or partition"}}',
    picks={"topic": ["crm.contacts.changed", "crm.accounts.changed", "crm.deals.changed", "crm.notes.added"]},
)
new_cause(
    "node-amqp-no-exchange",
    "Error",
    "Channel closed by server: 404 (NOT-FOUND) with message \"NOT_FOUND - no exchange '{=ex}' in vhost '/'\"",
    picks={"ex": ["notifications.fanout", "audit.topic", "search.reindex", "pricing.changes"]},
)
new_cause(
    "dotnet-servicebus-entity",
    "Azure.Messaging.ServiceBus.ServiceBusException",
    "The messaging entity 'sb://acme-prod.servicebus.windows.net/{=entity}' could not be found. To know more visit "
    "https://aka.ms/sbResourceMgrExceptions. (MessagingEntityNotFound)",
    picks={"entity": ["invoices-out", "dunning-reminders", "ledger-postings", "tax-filings"]},
)
new_cause(
    "php-amqp-no-queue",
    "PhpAmqpLib\\Exception\\AMQPProtocolChannelException",
    "NOT_FOUND - no queue '{=q}' in vhost 'shop'",
    picks={"q": ["mail.transactional", "mail.marketing", "pdf.render", "sitemap.rebuild"]},
)

# One cause, XML element names from a short list ----------------------------------------------------------------

new_cause(
    "py-lxml-tag-mismatch",
    "lxml.etree.XMLSyntaxError",
    "Opening and ending tag mismatch: {=open} line {small} and {=close}, line {small}, column {col}",
    picks={"open|close": ["ShipTo|ShipFrom", "UnitPrice|Price", "Item|Items", "Note|Notes", "Carrier|CarrierCode"]},
)
new_cause(
    "java-sax-end-tag",
    "org.xml.sax.SAXParseException",
    'lineNumber: {small}; columnNumber: {col}; The element type "{=el}" must be terminated by the matching end-tag '
    '"</{=el}>".',
    picks={"el": ["cbc:TaxAmount", "cac:InvoiceLine", "cbc:Note", "cac:PartyName", "cbc:PaymentID"]},
)
new_cause(
    "dotnet-xml-end-tag",
    "System.Xml.XmlException",
    "The '{=open}' start tag on line {small} position {small} does not match the end tag of '{=close}'. Line "
    "{small}, position {col}.",
    picks={"open|close": ["Consignment|Consignments", "Piece|Pieces", "Address|Adress", "Reference|Ref"]},
)

# One cause, a value with spaces inside a URL (cut at the space by a tokenizer) -----------------------------------

new_family(
    "py-freight-quote-url",
    "freight.errors.QuoteFailed",
    "freight quote failed with HTTP [V1]: GET https://rates.freight-hub.example/v1/quote?from={=origin}&to={=dest}"
    "&kg={small}",
    ["502", "504"],
    picks={
        "origin": ["2353 WB", "1012 AB", "SW1A 1AA", "EC1V 9HX", "75001 Paris"],
        "dest": ["10115 Berlin", "00-950 Warszawa", "1000 Bruxelles", "D02 X285"],
    },
    weight=1.3,
)
new_cause(
    "node-geocoder-429",
    "Error",
    "geocoder responded 429 Too Many Requests to GET https://geo.maps-api.example/search?q={=q}&limit=5&lang=en",
    picks={"q": ["Rue de la Paix 12", "Calle de Alcala 45", "Via Roma", "Baker Street 221B", "Karl Johans gate 7"]},
)
new_cause(
    "ruby-faraday-postcode",
    "Faraday::ServerError",
    "the server responded with status 503 for GET https://postcodes.lookup.example/v2/resolve?country=NL&postcode="
    "{=pc}&house_number={small}",
    picks={"pc": ["3011 AD", "5611 EM", "9711 LM", "6211 CK"]},
)

# One cause, a variable first word --------------------------------------------------------------------------------

new_cause(
    "py-replica-write",
    "ledger.db.WriteRejected",
    "{=node}: cannot execute UPDATE in a read-only transaction",
    picks={"node": ["pg-replica-1.db.internal:5432", "pg-replica-2.db.internal:5432", "pg-replica-3.db.internal:5432"]},
)
new_cause(
    "ruby-sidekiq-redis-timeout",
    "",
    "{=job} failed: Redis::TimeoutError: Connection timed out",
    picks={
        "job": ["InvoiceMailerJob", "SyncInventoryJob", "ExpireCartsJob", "RecalculateLoyaltyJob", "PurgeSessionsJob"]
    },
    weight=1.3,
)
new_cause(
    "node-es-circuit-breaker",
    "ResponseError",
    "[{=node}] circuit_breaking_exception: [parent] Data too large, data for [indices:data/write/bulk[s]] would be "
    "[{big}/{small}.{small}gb], which is larger than the limit of [1020054732/972.7mb]",
    picks={"node": ["es-data-0", "es-data-1", "es-data-2", "es-data-3"]},
)
new_cause(
    "go-kafka-broker-pipe",
    "",
    "{=broker}: write tcp {ip}:{port}->{ip}:9092: write: broken pipe",
    picks={
        "broker": [
            "kafka-0.kafka-headless.data.svc:9092",
            "kafka-1.kafka-headless.data.svc:9092",
            "kafka-2.kafka-headless.data.svc:9092",
        ]
    },
)

# One cause, a run of values whose token count varies -----------------------------------------------------------

new_cause(
    "go-upload-eof",
    "",
    "upload {uuid} aborted after {=sent}: unexpected EOF",
    picks={
        "sent": [
            "0 bytes",
            "734 bytes",
            "20480 bytes (20.00 KiB)",
            "98304 bytes (96.00 KiB)",
            "3145728 bytes (3.00 MiB)",
        ]
    },
)
new_cause(
    "py-retry-budget",
    "retrying.RetryBudgetExhausted",
    "gave up on {queue} delivery {uuid} after waiting {=wait}",
    picks={"wait": ["45s", "12m", "3m 20s", "1h 2m 5s", "2h 0m 30s"]},
)
new_cause(
    "node-bull-stalled",
    "Error",
    "job {int} stalled: processing took {=dur}, longer than the lock duration of 30 s",
    picks={"dur": ["31 s", "45 s", "2 min", "1 min 4 s", "1 h 3 min 12 s"]},
)

# Look-alikes: the same exception type from the same frames, another message ------------------------------------

SIGNUP_FRAMES = [
    ("/app/accounts/consumers.py", 34, "on_signup_submitted", "profile = build_profile(event)"),
    ("/app/accounts/profiles.py", 58, "build_profile", "ensure_valid(event.payload)"),
    ("/app/accounts/checks.py", 21, "ensure_valid", "raise SignupRejected(problem)"),
]
for slug, text in [
    ("email-domain", "contact_email '{user}@' has no domain part"),
    ("birth-date", "date_of_birth {date} lies in the future"),
    ("consent", "marketing_consent must be given explicitly for newsletter sign-ups"),
    ("referral", "referral_code {hex8} was already redeemed"),
]:
    new_cause(
        f"py-signup-rejected:{slug}",
        "accounts.checks.SignupRejected",
        text,
        family_id="py-signup-rejected",
        trace=py_trace(SIGNUP_FRAMES, "accounts.checks.SignupRejected: {=message}"),
    )

ORDER_LINE_FRAMES = [
    "com.google.common.base.Preconditions.checkArgument(Preconditions.java:218)",
    "com.acme.orders.domain.OrderLine.<init>(OrderLine.java:47)",
    "com.acme.orders.domain.OrderFactory.lineFrom(OrderFactory.java:88)",
    "com.acme.orders.messaging.CartCheckedOutListener.onMessage(CartCheckedOutListener.java:36)",
]
for slug, text in [
    ("negative-price", "unitPrice must not be negative, was -{amount}"),
    ("line-limit", "quantity {int} exceeds the per-line limit of 999"),
    ("currency", "currency {currency} does not match the order currency"),
    ("discount-cap", "discount of {small}% is above the 30% cap"),
]:
    new_cause(
        f"java-order-line-check:{slug}",
        "java.lang.IllegalArgumentException",
        text,
        family_id="java-order-line-check",
        trace=java_trace("java.lang.IllegalArgumentException: {=message}", ORDER_LINE_FRAMES),
    )

MANIFEST_FRAMES = [
    ("github.com/acme/shipping/internal/manifest.mustValid", "/src/internal/manifest/validate.go:29"),
    ("github.com/acme/shipping/internal/manifest.(*Builder).Add", "/src/internal/manifest/builder.go:64"),
    ("github.com/acme/shipping/internal/worker.(*Worker).handle", "/src/internal/worker/worker.go:171"),
]
for slug, text in [
    ("weight", "shipment {uuid}: weight_grams must be greater than zero"),
    ("customs", "shipment {uuid}: declared value exceeds the customs limit for {country}"),
    ("phone", "shipment {uuid}: recipient phone number is missing"),
]:
    new_cause(
        f"go-manifest-panic:{slug}",
        "",
        text,
        family_id="go-manifest-panic",
        trace=go_trace("panic: {=message}", MANIFEST_FRAMES),
    )

ASSERT_FRAMES = [
    ("assertOrderPayload", "/app/dist/orders/assert.js:19"),
    ("OrderConsumer.handle", "/app/dist/orders/consumer.js:52"),
    ("Consumer.executeHandler", "/app/node_modules/sqs-consumer/dist/consumer.js:372"),
]
for slug, text in [
    ("items", "payload.items must be a non-empty array"),
    ("currency", 'payload.currency must be an ISO 4217 code, got "{badvalue}"'),
    ("customer-id", "payload.customer.id must be a string, got number"),
]:
    new_cause(
        f"node-order-assert:{slug}",
        "Error",
        text,
        family_id="node-order-assert",
        trace=node_trace("Error: {=message}", ASSERT_FRAMES),
    )

REFUND_FRAMES: list[tuple[str, str | None]] = [
    (
        "Acme.Billing.Invoices.InvoiceStateMachine.Refund(Invoice invoice)",
        "/src/Acme.Billing/Invoices/InvoiceStateMachine.cs:112",
    ),
    (
        "Acme.Billing.Consumers.RefundRequestedConsumer.Consume(ConsumeContext`1 context)",
        "/src/Acme.Billing/Consumers/RefundRequestedConsumer.cs:40",
    ),
]
for slug, text in [
    ("draft", "Cannot refund invoice {invoice}: it is still a draft."),
    ("refunded", "Cannot refund invoice {invoice}: it was already refunded on {date}."),
]:
    new_cause(
        f"dotnet-refund-state:{slug}",
        "System.InvalidOperationException",
        text,
        family_id="dotnet-refund-state",
        trace=dotnet_trace("System.InvalidOperationException: {=message}", REFUND_FRAMES),
    )

# Look-alikes: a refused or timed-out connection to another service -------------------------------------------

new_family(
    "go-dial",
    "",
    "handle message from {queue}: dial tcp {ip}:[V1]: [V2]",
    [
        ("6379", "connect: connection refused"),
        ("5672", "connect: connection refused"),
        ("9200", "connect: connection refused"),
        ("5432", "i/o timeout"),
        ("6379", "i/o timeout"),
    ],
    weight=1.2,
)
new_family(
    "py-connect-call",
    "ConnectionRefusedError",
    "[Errno 111] Connect call failed ('{ip}', [V1])",
    ["6379", "5432", "8000"],
)
new_family(
    "py-connect-timeout",
    "requests.exceptions.ConnectTimeout",
    "HTTPConnectionPool(host='[V1]', port=8080): Max retries exceeded with url: /v1/[V2] (Caused by "
    "ConnectTimeoutError(<urllib3.connection.HTTPConnection object at 0x7f{hex8}>, 'Connection to [V1] timed out. "
    "(connect timeout=5)'))",
    [("recommendations.internal", "suggest"), ("search-proxy.internal", "suggest")],
)
new_family(
    "node-connect",
    "Error",
    "connect [V1] {ip}:[V2]",
    [("ECONNREFUSED", "5432"), ("ECONNREFUSED", "27017"), ("ECONNREFUSED", "8080"), ("ETIMEDOUT", "5432")],
    weight=1.2,
)
new_family(
    "java-netty-refused",
    "io.netty.channel.AbstractChannel$AnnotatedConnectException",
    "Connection refused: [V1]/{ip}:[V2]",
    [("orders-db.internal", "5432"), ("session-cache.internal", "6379"), ("pricing.internal", "8080")],
)

# Look-alikes: the same request, another HTTP status --------------------------------------------------------------

new_family(
    "py-httpx-catalog-media",
    "httpx.HTTPStatusError",
    "[V1] '[V2] [V3]' for url 'https://catalog.internal/v2/products/{sku}/media'\nFor more information check: "
    "https://developer.mozilla.org/en-US/docs/Web/HTTP/Status/[V2]",
    [("Client error", "404", "Not Found"), ("Server error", "503", "Service Unavailable")],
)
new_family(
    "go-catalog-status",
    "",
    "GET https://catalog.internal/v1/items/{sku}: unexpected status [V1]",
    ["404 Not Found", "503 Service Unavailable", "429 Too Many Requests"],
    weight=1.2,
)
new_family(
    "rust-reqwest-status",
    "reqwest::Error",
    "HTTP status [V1] error ([V2]) for url (https://ledger.internal/api/accounts/{int}/balance)",
    [("client", "404 Not Found"), ("server", "503 Service Unavailable")],
)
new_family(
    "node-fetch-cms-status",
    "FetchError",
    "HTTP [V1] while fetching https://cms.internal/api/pages/{int}?locale=en",
    ["404", "503"],
)


# Generation ----------------------------------------------------------------------------------------------------


def split_of(family_id: str, held_out: int = 1) -> str:
    # A stable hash, not Python's randomised one: held_out families in five are held out (one for the causes of
    # CAUSES, two for NEW_CAUSES, so that the held-out part has many new causes).
    return "heldout" if zlib.crc32(family_id.encode()) % 5 < held_out else "train"


PICK = re.compile(r"\{=([\w|]+)\}")


def _draw(picks: dict[str, list[str]], rng: R) -> dict[str, str]:
    """One value of each pick ("a|b" names linked values "x|y"), its own slots filled."""
    values: dict[str, str] = {}
    for names, options in picks.items():
        values.update(zip(names.split("|"), fill(rng.choice(options), rng).split("|"), strict=True))
    return values


def _put(text: str, values: dict[str, str]) -> str:
    out = PICK.sub(lambda match: values[match.group(1)], text)
    assert "{=" not in out, out
    return out


def _rows(causes: list[Cause], rng: R, held_out: int) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for item in causes:
        # Most causes are a handful to a few dozen messages; a few are rare.
        count = max(2, min(60, round(rng.lognormvariate(2.45, 0.55) * item.weight)))
        if item.picks:
            count = max(count, NEW_MIN_PICKED)
        for _ in range(count):
            values = _draw(item.picks, rng)
            message = _put(fill(item.template, rng), values)
            values["message"] = message
            error_type = item.error_type
            # Some producers send the type in its own header, others print "Type: message" as the error text.
            if error_type and message and rng.random() < 0.25:
                message = f"{error_type}: {message}"
                error_type = ""
            rows.append(
                {
                    "cause": item.cause,
                    "split": split_of(item.family, held_out),
                    "error_type": error_type,
                    "message": message,
                    "stack_trace": _put(item.trace(rng), values) if item.trace else "",
                }
            )
    rng.shuffle(rows)
    return rows


def generate() -> list[dict[str, str]]:
    """The rows of CAUSES, then those of NEW_CAUSES: each list from its own seed, shuffled among themselves."""
    return _rows(CAUSES, random.Random(SEED), 1) + _rows(NEW_CAUSES, random.Random(NEW_SEED), 2)


def main() -> None:
    ids = [item.cause for item in CAUSES + NEW_CAUSES]
    assert len(ids) == len(set(ids)), "a cause id is used twice"
    rows = generate()
    causes = {row["cause"] for row in rows}
    for item in NEW_CAUSES:
        if item.picks:
            shown = {row["message"] for row in rows if row["cause"] == item.cause}
            assert len(shown) > 1, f"{item.cause}: a single message"
    assert len(rows) >= MIN_MESSAGES, f"only {len(rows)} messages"
    assert len(causes) >= 200, f"only {len(causes)} causes"
    with OUTPUT.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    held = {row["cause"] for row in rows if row["split"] == "heldout"}
    print(f"{len(rows)} messages, {len(causes)} causes ({len(held)} held out) -> {OUTPUT}")  # noqa: T201
    new_ids = {item.cause for item in NEW_CAUSES}
    new_rows = [row for row in rows if row["cause"] in new_ids]
    new_held = {row["cause"] for row in new_rows if row["split"] == "heldout"}
    print(f"of which new: {len(new_rows)} messages, {len(new_ids)} causes ({len(new_held)} held out)")  # noqa: T201


if __name__ == "__main__":
    main()
