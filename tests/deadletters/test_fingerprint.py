from __future__ import annotations

from dlqconsole.deadletters.fingerprint import fingerprint, split_error_type
from dlqconsole.deadletters.masking import mask, tokenize
from dlqconsole.deadletters.stacktrace import headline, signature


def test_masking_replaces_ids_numbers_times_and_addresses() -> None:
    assert mask("Order 48213 for bob@example.com failed at 2026-11-20T10:00:00Z from 10.0.3.7:5672") == (
        "Order <NUM> for <EMAIL> failed at <DATETIME> from <IP>:<NUM>"
    )
    assert mask("reservation 9b2f4c1e-8a7d-4e21-b3c4-5d6e7f809a1b released, tx 0x7f3a2c1d0e50") == (
        "reservation <UUID> released, tx <HEX>"
    )
    assert mask("charge ch_swFSncWCQpKTMNaaBBcc refused for cus_QwErTyUiOpAsDf") == "charge <ID> refused for <ID>"


def test_masking_keeps_units_and_collapses_whitespace() -> None:
    assert mask("timed out after 5000ms\n\tretry in  3.5s") == "timed out after <NUM>ms retry in <NUM>s"


def test_a_list_of_values_joined_by_commas_is_one_value() -> None:
    assert mask("replicas 10.0.3.7,10.0.3.8,10.0.3.9 unreachable") == "replicas <IP> unreachable"
    assert mask("replicas 10.0.3.7 unreachable") == "replicas <IP> unreachable"
    assert mask("skipped rows 4,18 of batch 7") == "skipped rows <NUM> of batch <NUM>"
    assert mask("expected one of red,green,blue") == "expected one of red,green,blue"


def test_a_path_with_a_wildcard_is_a_path() -> None:
    assert mask("no route for /exports/*") == "no route for <PATH>"
    assert mask("cannot read /srv/spool/*.json") == "cannot read <PATH>"


def test_http_status_codes_are_kept_because_they_name_the_failure() -> None:
    assert mask("Request failed with status code 404") == "Request failed with status code 404"
    assert mask("503 Server Error: Service Unavailable for url: https://api.example/v1/x") == (
        "503 Server Error: Service Unavailable for url: https://api.example/…"
    )
    assert mask("took 503 ms") == "took <NUM> ms"


def test_url_keeps_the_host_that_names_the_dependency_but_not_the_path() -> None:
    fraud = mask('POST "http://fraud-check:8080/v1/score/123": Read timed out')
    loyalty = mask('POST "http://loyalty:8080/v1/accruals/9": Read timed out')

    assert fraud == 'POST "http://fraud-check/…": Read timed out'
    assert fraud != loyalty
    assert mask("GET https://10.0.3.4/health failed") == "GET <URL> failed"


def test_a_short_quoted_value_is_one_token_and_a_long_quotation_is_cut_up() -> None:
    short = tokenize("product 'Blue Widget XL' is out of stock")
    nested = tokenize("(1062, \"Duplicate entry 'rosa' for key 'users.username'\")")

    assert short[1] == " 'Blue Widget XL'"
    assert len(short) == 6
    assert " 'rosa'" in nested and " 'users.username'" in nested


def test_tokens_join_back_into_the_template() -> None:
    message = "HTTPSConnectionPool(host='payments-api.internal', port=443): Max retries exceeded with url: /v1/x"
    found = fingerprint(error_type="ConnectionError", message=message)

    assert "".join(found.tokens) == found.template
    assert found.template == (
        "HTTPSConnectionPool(host='payments-api.internal', port=<NUM>): Max retries exceeded with url: <PATH>"
    )


def test_key_depends_on_error_type_and_template_only() -> None:
    first = fingerprint(error_type="KeyError", message="order 12 missing")
    second = fingerprint(error_type="KeyError", message="order 99 missing")
    other_type = fingerprint(error_type="ValueError", message="order 12 missing")

    assert first.key == second.key
    assert first.key != other_type.key
    assert len(first.key) == 40


def test_empty_message_uses_the_fallback_name() -> None:
    found = fingerprint(error_type="", message="", fallback="expired from orders")

    assert found.template == "expired from orders"
    assert found.kind == "empty"


def test_split_error_type_reads_type_prefixed_messages() -> None:
    assert split_error_type("ValueError: bad id 42") == ("ValueError", "bad id 42")
    assert split_error_type("java.lang.IllegalStateException: boom") == ("java.lang.IllegalStateException", "boom")
    assert split_error_type("user alice not found: retry later") == ("", "user alice not found: retry later")


PYTHON_TRACE = """Traceback (most recent call last):
  File "/usr/local/lib/python3.12/site-packages/celery/app/trace.py", line {celery}, in trace_task
    R = retval = fun(*args, **kwargs)
  File "/app/orders/tasks.py", line {task}, in apply_promotions
    total = pricing.apply_discount(order, code)
  File "/app/orders/pricing.py", line 41, in apply_discount
    rate = DISCOUNTS[code]
KeyError: '{code}'"""


def test_python_trace_groups_by_exception_type_and_innermost_application_frames() -> None:
    one = fingerprint(
        error_type="KeyError", message="'SPRING'", stack_trace=PYTHON_TRACE.format(celery=453, task=88, code="SPRING")
    )
    other_release = fingerprint(
        error_type="KeyError", message="'XMAS'", stack_trace=PYTHON_TRACE.format(celery=460, task=93, code="XMAS")
    )
    elsewhere = fingerprint(
        error_type="KeyError",
        message="'SPRING'",
        stack_trace=PYTHON_TRACE.format(celery=453, task=88, code="SPRING").replace("pricing.py", "coupons.py"),
    )

    assert one.kind == "trace"
    assert one.key == other_release.key
    assert one.key != elsewhere.key
    assert one.template == "KeyError at orders/tasks.py:apply_promotions → orders/pricing.py:apply_discount"


def test_a_trace_pattern_shows_the_message_with_its_values_masked() -> None:
    trace = PYTHON_TRACE.format(celery=453, task=88, code="SPRING")

    found = fingerprint(
        error_type="KeyError",
        message="KeyError: Order 102386: field 'shipping_address' is required\nmore detail",
        stack_trace=trace,
    )
    other = fingerprint(
        error_type="orders.errors.ValidationError", message="field 'email' is required", stack_trace=trace
    )

    assert found.template == (
        "KeyError at orders/tasks.py:apply_promotions → orders/pricing.py:apply_discount:"
        " Order <NUM>: field <*> is required"
    )
    # The key is the type, the frames and the masked message: another value is the same cause, another message
    # raised at the same place is not.
    again = fingerprint(
        error_type="KeyError", message="KeyError: Order 7: field 'email' is required", stack_trace=trace
    )
    assert again.key == found.key
    assert other.key != found.key
    assert found.kind == other.kind == "trace"


def test_python_chained_trace_is_named_by_its_root_cause() -> None:
    trace = """Traceback (most recent call last):
  File "/app/crm/client.py", line 140, in fetch_contact
    response.raise_for_status()
  File "/usr/local/lib/python3.12/site-packages/requests/models.py", line 1024, in raise_for_status
    raise HTTPError(http_error_msg, response=self)
requests.exceptions.HTTPError: 429 Client Error

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/app/crm/tasks.py", line 80, in sync_contact
    raise SyncFailed('could not sync') from error
crm.errors.SyncFailed: could not sync contact 7"""

    found = signature(trace)

    assert found is not None
    assert found.error_type == "requests.exceptions.HTTPError"
    assert found.frames == ("crm/client.py:fetch_contact",)


JAVA_TRACE = """org.springframework.amqp.rabbit.support.ListenerExecutionFailedException: Listener threw exception
\tat org.springframework.amqp.rabbit.listener.MessageListenerContainer.doInvoke(MessageListenerContainer.java:1760)
\tat java.base/java.lang.Thread.run(Thread.java:1583)
Caused by: java.lang.IllegalStateException: reservation 42 already released
\tat com.acme.inventory.reservation.Reservation.release(Reservation.java:{line})
\tat com.acme.inventory.reservation.ReservationService.cancel(ReservationService.java:131)
\tat jdk.proxy2/jdk.proxy2.$Proxy{proxy}.cancel(Unknown Source)
\tat com.acme.inventory.messaging.StockListener.onMessage(StockListener.java:52)
\t... 12 more"""


def test_java_trace_uses_the_root_cause_and_skips_framework_frames() -> None:
    one = signature(JAVA_TRACE.format(line=88, proxy=101))
    other = signature(JAVA_TRACE.format(line=90, proxy=177))

    assert one is not None
    assert one == other
    assert one.error_type == "java.lang.IllegalStateException"
    assert one.frames == (
        "com.acme.inventory.reservation.Reservation.release",
        "com.acme.inventory.reservation.ReservationService.cancel",
    )


def test_go_panic_skips_runtime_and_module_cache_frames() -> None:
    trace = """panic: runtime error: invalid memory address or nil pointer dereference
[signal SIGSEGV: segmentation violation code=0x1 addr=0x18 pc=0x6d3f2a]

goroutine 42 [running]:
runtime.panicmem(...)
\t/usr/local/go/src/runtime/panic.go:261 +0x48
github.com/acme/shipping/internal/label.(*Printer).Render(0xc000123456, 0x0)
\t/src/internal/label/printer.go:88 +0x2a
github.com/rabbitmq/amqp091-go.(*Channel).dispatch(0xc0000a8000)
\t/go/pkg/mod/github.com/rabbitmq/amqp091-go@v1.10.0/channel.go:352 +0x1d
main.main()
\t/src/main.go:30 +0x11"""

    found = signature(trace)

    assert found is not None
    # A Go panic has no type: its message (the "panic: " line) is the fingerprint's message, mined like text.
    assert found.error_type == "panic"
    assert headline(trace) == "panic: runtime error: invalid memory address or nil pointer dereference"
    assert found.frames == ("github.com/acme/shipping/internal/label.(*Printer).Render", "main.main")


def test_node_trace_skips_node_modules_and_internals() -> None:
    trace = """TypeError: Cannot read properties of undefined (reading 'sku')
    at mapLineItem (/app/src/orders/mapper.js:42:31)
    at Array.map (<anonymous>)
    at async toWarehouseOrder (/app/src/orders/mapper.js:18:27)
    at Channel.emit (/app/node_modules/amqplib/lib/channel.js:480:12)
    at process.processTicksAndRejections (node:internal/process/task_queues:95:5)"""

    found = signature(trace)

    assert found is not None
    assert found.error_type == "TypeError"
    assert found.frames == ("orders/mapper.js:mapLineItem", "orders/mapper.js:toWarehouseOrder")


def test_dotnet_trace_skips_system_frames() -> None:
    trace = """System.InvalidOperationException: Sequence contains no elements
   at System.Linq.ThrowHelper.ThrowNoElementsException()
   at Acme.Shipping.RateSelector.Cheapest(IReadOnlyList`1 rates) in /src/Acme.Shipping/RateSelector.cs:line 22
   at Acme.Shipping.Consumers.QuoteConsumer.Consume(ConsumeContext`1 context) in /src/QuoteConsumer.cs:line 35"""

    found = signature(trace)

    assert found is not None
    assert found.frames == ("Acme.Shipping.RateSelector.Cheapest", "Acme.Shipping.Consumers.QuoteConsumer.Consume")


def test_trace_without_application_frames_falls_back_to_the_message() -> None:
    trace = """Traceback (most recent call last):
  File "/usr/local/lib/python3.12/site-packages/kombu/messaging.py", line 656, in _receive_callback
    return on_m(message)
ValueError: bad payload 17"""

    found = fingerprint(error_type="ValueError", message="bad payload 17", stack_trace=trace)

    assert found.kind == "text"
    assert found.template == "bad payload <NUM>"


def test_a_message_that_is_a_whole_printed_trace_is_grouped_as_a_trace() -> None:
    printed = JAVA_TRACE.format(line=88, proxy=101)

    found = fingerprint(error_type="", message=printed)

    assert found.kind == "trace"
    assert found.template.startswith("IllegalStateException at ReservationService.cancel → Reservation.release: ")


def test_a_date_written_with_month_and_weekday_names_is_one_time() -> None:
    assert mask("connection from 10.1.2.3 at Fri Jun 17 07:07:00 2005") == "connection from <IP> at <DATETIME>"
    assert mask("lease expired Sat Jul  9 11:35:59 2005, renewing") == "lease expired <DATETIME>, renewing"
    assert mask("Expires: Sun, 06 Nov 1994 08:49:37 GMT") == "Expires: <DATETIME>"
    assert mask("cron ran Jun 17 07:07:00 on host") == "cron ran <DATETIME> on host"
    # Without a time of day a month name is a word like any other.
    assert mask("May quota reached for Jun invoices") == "May quota reached for Jun invoices"


def test_a_url_leaves_the_punctuation_that_follows_it() -> None:
    assert mask("fetch http://10.0.0.1:8080/a/b: connection refused") == "fetch <URL>: connection refused"
    assert mask("see https://status.example.com/incidents/42.") == "see https://status.example.com/…."


def test_only_a_type_name_is_split_off_as_the_error_type() -> None:
    assert split_error_type("ActiveRecord::RecordNotFound: no row") == ("ActiveRecord::RecordNotFound", "no row")
    assert split_error_type("grpc._channel._InactiveRpcError: gone") == ("grpc._channel._InactiveRpcError", "gone")
    # A dotted name whose last part is not a class name is a logger or a job, and the line is all message.
    assert split_error_type("com.example.billing.nightly: run skipped") == (
        "",
        "com.example.billing.nightly: run skipped",
    )
    assert split_error_type("cron://db-7/jobs: failed") == ("", "cron://db-7/jobs: failed")
    # A reverse-domain name with a capitalised part before the last is an app's or a job's id, not a JVM class.
    assert split_error_type("com.apple.Safari.SafeBrowsing.Update: run skipped") == (
        "",
        "com.apple.Safari.SafeBrowsing.Update: run skipped",
    )
    assert split_error_type("org.acme.billing.InvoiceException: gone") == ("org.acme.billing.InvoiceException", "gone")
    assert split_error_type("System.Net.Http.HttpRequestException: 503") == (
        "System.Net.Http.HttpRequestException",
        "503",
    )


def test_long_colon_separated_hex_is_one_value_and_a_mac_address_stays_an_address() -> None:
    # Key fingerprints and serials longer than an IPv6 address were masked piece by piece, differently each time.
    first = fingerprint(
        error_type="HostKeyError",
        message="host key fingerprint 16:27:ac:a5:76:28:2d:36:63:1b:56:4d:eb:df:a6:48 mismatch",
    )
    second = fingerprint(
        error_type="HostKeyError",
        message="host key fingerprint 9f:01:e2:23:00:0d:60:e9:1d:dc:ff:f2:9f:15:7b:e0 mismatch",
    )

    assert first.template == "host key fingerprint <HEX> mismatch"
    assert first.key == second.key
    assert "".join(tokenize("link up on 00:1A:2B:3C:4D:5E")) == "link up on <IP>"
