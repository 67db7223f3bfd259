"""Grouping rules that generalise: each kind of varying word that is data joins one pattern, and each kind of word
that names the cause keeps patterns apart. Messages are written fresh here, not taken from the corpus."""

from __future__ import annotations

import pytest

from dlqconsole.deadletters.fingerprint import fingerprint, leading_error_type, split_error_type
from dlqconsole.deadletters.grouping.engine import Grouper, group_lines
from dlqconsole.deadletters.masking import tokenize


def templates(lines: list[str]) -> set[str]:
    return {pattern.template for pattern in group_lines(lines)}


ONE_PATTERN = {
    "host and port the line opens with": [
        "cdn.example.net:443 open through proxy gw.corp:3128 HTTPS",
        "ssl.gstatic.com:443 open through proxy gw.corp:3128 HTTPS",
        "wpad:80 open through proxy gw.corp:3128 HTTPS",
    ],
    "value of a key=value pair": [
        "acquire lock=1, tag=ViewLock, uid=10",
        "acquire lock=2, tag=RILJ, uid=11",
    ],
    "a flag's literal": ["overlap check ret:false", "overlap check ret:true"],
    "a value with brackets beside a name": [
        "synchronized to 10.1.2.3, stratum 3",
        "synchronized to 10.1.2.4, stratum 2",
        "synchronized to ntp.example.org, stratum 2",
        "synchronized to LOCAL(0), stratum 10",
    ],
    "a quoted identifier with three values": [
        "Unknown event type 'invoice.voided': no handler registered",
        "Unknown event type 'invoice.paid': no handler registered",
        "Unknown event type 'payout.failed': no handler registered",
    ],
    "a class name the message opens with": [
        "ExpireCartsJob failed: Redis::TimeoutError: Connection timed out",
        "SyncStockJob failed: Redis::TimeoutError: Connection timed out",
        "MailDigestJob failed: Redis::TimeoutError: Connection timed out",
    ],
    "hosts in a TLS failure": [
        "SSLError: HTTPSConnectionPool(host='a.hooks.example', port=443): certificate verify failed",
        "SSLError: HTTPSConnectionPool(host='b.hooks.example', port=443): certificate verify failed",
    ],
    "a URL whose query holds spaces": [
        "geocoder said 429 Too Many Requests for GET https://geo.example/search?q=Rua Augusta 12&limit=5",
        "geocoder said 429 Too Many Requests for GET https://geo.example/search?q=Main St&limit=5",
    ],
    "a quoted value the message repeats": [
        "Reverse for 'home-page' not found. 'home-page' is not a valid view function",
        "Reverse for 'cart-detail' not found. 'cart-detail' is not a valid view function",
        "Reverse for 'order-list' not found. 'order-list' is not a valid view function",
    ],
    "a list of one value separated by spaces": [
        "ask 10.0.0.1:50010 to delete blk_1001",
        "ask 10.0.0.2:50010 to delete blk_1002 blk_1003 blk_1004",
    ],
    "a client's ephemeral port": [
        "Error reading from socket to 10.0.0.9:41587, Connection reset by peer",
        "Error reading from socket to 10.0.0.9:52930, Connection reset by peer",
    ],
}

SERVICES = ("fraud.internal", "stock.internal", "tax.internal", "geo.internal", "mail.internal", "crm.internal")

APART = {
    "the port of a refused connection": [
        "connect ECONNREFUSED 10.0.0.7:5432",
        "connect ECONNREFUSED 10.0.0.8:6379",
        "connect ECONNREFUSED 10.0.0.9:27017",
    ],
    "a service port in Python's form": [
        "[Errno 111] Connect call failed ('10.0.0.7', 5432)",
        "[Errno 111] Connect call failed ('10.0.0.8', 6379)",
        "[Errno 111] Connect call failed ('10.0.0.9', 8000)",
    ],
    "HTTP statuses": [
        "Request failed with status code 404",
        "Request failed with status code 503",
        "Request failed with status code 500",
    ],
    "two quoted look-alikes": [
        "CircuitBreaker 'inventory' is OPEN and does not permit further calls",
        "CircuitBreaker 'pricing' is OPEN and does not permit further calls",
    ],
    "the host that refused": [
        "HTTPConnectionPool(host='payments.internal', port=80): Max retries exceeded (Connection refused)",
        "HTTPConnectionPool(host='search.internal', port=80): Max retries exceeded (Connection refused)",
        "HTTPConnectionPool(host='tax.internal', port=80): Max retries exceeded (Connection refused)",
    ],
    "the host of a key that names the dependency, however many": [
        f"HTTPSConnectionPool(host='{host}', port=443): Read timed out. (read timeout=3)" for host in SERVICES
    ],
    "an address and a named host of a key that names the dependency": [
        "HTTPSConnectionPool(host='10.42.3.17', port=5432): Read timed out. (read timeout=30)",
        "HTTPSConnectionPool(host='psp-gateway.example.net', port=443): Read timed out. (read timeout=5)",
    ],
    "the port of a key that names it, in a connection that timed out": [
        "HTTPSConnectionPool(host='10.42.3.17', port=5432): Read timed out. (read timeout=30)",
        "HTTPSConnectionPool(host='10.42.3.18', port=6379): Read timed out. (read timeout=30)",
    ],
    "the host of a URL that timed out, however many": [
        f"Read timed out after 3000 ms calling https://{host}/v2/captures/P-1" for host in SERVICES
    ],
}

PYTHON_TRACE = """Traceback (most recent call last):
  File "/app/shop/payments/capture.py", line 41, in capture
    response = session.post(url, json=body, timeout=3)
requests.exceptions.ReadTimeout: {message}
"""


@pytest.mark.parametrize("kind", sorted(ONE_PATTERN))
def test_data_of_each_kind_joins_one_pattern(kind: str) -> None:
    assert len(templates(ONE_PATTERN[kind])) == 1, kind


@pytest.mark.parametrize("kind", sorted(APART))
def test_words_that_name_the_cause_keep_patterns_apart(kind: str) -> None:
    lines = APART[kind]
    assert len(templates(lines)) == len(lines), kind


def test_what_masking_keeps_and_drops() -> None:
    assert "".join(tokenize("connect ECONNREFUSED 10.0.0.7:5432")) == "connect ECONNREFUSED <IP>:5432"
    assert "".join(tokenize("socket to 10.0.0.7:5432 opened")) == "socket to <IP>:<NUM> opened"
    assert "".join(tokenize("tls: certificate is valid for a.example.com, not b.example.com")) == (
        "tls: certificate is valid for <HOST>, not <HOST>"
    )
    assert "".join(tokenize("certificate problem for https://feeds.example.io/api?page=2")) == (
        "certificate problem for <URL>"
    )
    assert "".join(tokenize("GET https://geo.example/search?q=Rua Augusta 12&limit=5 failed")) == (
        "GET https://geo.example/… failed"
    )
    assert "".join(tokenize("Path `customer.email` is required: `customer.email`")) == (
        "Path `customer.email` is required: <REF>"
    )
    # A URL ends before the punctuation that closes a label or a sentence: the colon is the message's own.
    assert tokenize('429 Too Many Requests from POST https://geo.example.org/v1/quotes: "retry later"')[-3:] == (
        " https://geo.example.org/…",
        ":",
        ' "retry later"',
    )


@pytest.mark.parametrize(
    ("line", "error_type"),
    [
        ("reqwest::Error: HTTP status client error (404 Not Found)", "reqwest::Error"),
        ("GuzzleHttp\\Exception\\RequestException: cURL error 60", "GuzzleHttp\\Exception\\RequestException"),
        ("com.example.jobs.cleanup: nothing to do", ""),
    ],
)
def test_qualified_error_types_of_every_language_are_read(line: str, error_type: str) -> None:
    assert split_error_type(line)[0] == error_type
    if error_type:
        assert leading_error_type(line)[0] == error_type


GO_PANIC = """panic: shipment {id}: {message}

goroutine 1 [running]:
github.com/acme/shipping/manifest.mustValid(...)
\t/src/manifest/valid.go:41 +0x1d
github.com/acme/shipping/manifest.(*Builder).Add(0xc000010000)
\t/src/manifest/builder.go:88 +0x2b
main.main()
\t/src/main.go:12 +0x25
"""


def test_a_go_panic_is_grouped_by_its_frames_and_its_masked_message() -> None:
    grouper = Grouper()
    keys = [
        grouper.add(error_type="", message="", stack_trace=GO_PANIC.format(id=shipment, message=message))
        for shipment, message in [
            ("3e91c65f-ee64-4ad3-9431-6813b2a0ab2a", "weight_grams must be greater than zero"),
            ("eeb3a157-713a-4b3e-b5c7-a475028557c5", "weight_grams must be greater than zero"),
            ("955924b6-7769-4197-a0e1-778a87685c12", "recipient phone number is missing"),
        ]
    ]
    patterns = grouper.patterns()

    assert patterns[keys[0]].key == patterns[keys[1]].key != patterns[keys[2]].key
    assert patterns[keys[0]].template.startswith("panic at ")
    assert patterns[keys[0]].template.endswith(": panic: shipment <UUID>: weight_grams must be greater than zero")
    assert fingerprint(error_type="", message="", stack_trace=GO_PANIC.format(id="1", message="x")).kind == "trace"


@pytest.mark.parametrize(
    "message",
    [
        "HTTPSConnectionPool(host='{host}', port=443): Read timed out. (read timeout=3)",
        "Read timed out after 3000 ms calling https://{host}/v2/captures/P-1",
    ],
)
def test_timeouts_raised_at_one_place_keep_the_service_they_name(message: str) -> None:
    # Where a trace's message holds a quoted value, it is a value (any key or field the place names) unless it is the
    # value of a key that names the dependency; a URL keeps its host in a failed connection.
    grouper = Grouper()
    hosts = SERVICES
    keys = [
        grouper.add(error_type="", message="", stack_trace=PYTHON_TRACE.format(message=message.format(host=host)))
        for host in (*hosts, hosts[0])
    ]
    patterns = grouper.patterns()

    assert len({patterns[key].key for key in keys}) == len(hosts)
    assert patterns[keys[0]].key == patterns[keys[-1]].key
    assert "fraud.internal" in patterns[keys[0]].template
