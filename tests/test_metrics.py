"""/metrics: django-prometheus's own metrics plus dead-letter gauges computed from the database at scrape time."""

from __future__ import annotations

import datetime as dt
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from django.test import Client, override_settings
from django.utils import timezone
from prometheus_client.core import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from dlqconsole.alerts.evaluation import evaluate_rules
from dlqconsole.alerts.models import Alert, Channel
from dlqconsole.brokers.models import Broker
from dlqconsole.core.breaker import NACK, BreakerConfig, Event, get_breakers
from dlqconsole.deadletters.models import DeadLetter, DeadLetterStatus, FailurePattern, PatternStatus
from dlqconsole.ingest.models import QueueSample, WatchedQueue
from dlqconsole.metrics import MAX_BREAKERS, DeadLetterCollector, register_collector
from dlqconsole.operations.breakers import BreakerSetting
from dlqconsole.operations.models import Operation, OperationKind, OperationStatus
from tests.alerts.conftest import settle
from tests.factories import ParsedDeadLetterFactory, parked, rule, store

pytestmark = [pytest.mark.django_db]

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(client: Client) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def labels_of(samples: Samples, name: str, label: str) -> set[str]:
    return {dict(key)[label] for metric, key in samples if metric == name and label in dict(key)}


@pytest.mark.sqlite
def test_metrics_need_no_login_and_include_django_metrics(client: Client) -> None:
    samples = scrape(client)

    names = {name for name, _ in samples}
    assert any(name.startswith("django_http_requests") for name in names)
    assert value(samples, "dlq_metrics_up") == 1


@pytest.mark.sqlite
def test_dead_letters_by_queue_reason_and_status(client: Client) -> None:
    timeouts = parked(3, queue="orders.dlq", reason="TIMEOUT")
    parked(
        2, queue="orders.dlq", message="Validation failed: email", error_type="ValueError", reason="VALIDATION_FAILED"
    )
    parked(1, queue="emails.dlq", reason="TIMEOUT")
    settle(timeouts[:1])

    samples = scrape(client)

    assert (
        value(
            samples,
            "dlq_dead_letters",
            broker="default",
            queue="orders.dlq",
            reason="TIMEOUT",
            status="parked",
            pattern_status="open",
        )
        == 2
    )
    assert (
        value(
            samples,
            "dlq_dead_letters",
            broker="default",
            queue="orders.dlq",
            reason="TIMEOUT",
            status="replayed",
            pattern_status="open",
        )
        == 1
    )
    assert (
        value(
            samples,
            "dlq_dead_letters",
            broker="default",
            queue="orders.dlq",
            reason="VALIDATION_FAILED",
            status="parked",
            pattern_status="open",
        )
        == 2
    )
    assert (
        value(
            samples,
            "dlq_dead_letters",
            broker="default",
            queue="emails.dlq",
            reason="TIMEOUT",
            status="parked",
            pattern_status="open",
        )
        == 1
    )
    assert value(samples, "dlq_ingest_inserted_total", broker="default", queue="orders.dlq") == 5
    assert value(samples, "dlq_ingest_received_total", broker="default", queue="emails.dlq") == 1


@pytest.mark.sqlite
def test_oldest_parked_age(client: Client) -> None:
    letters = parked(2, queue="orders.dlq")
    DeadLetter.objects.filter(pk=letters[0].pk).update(ingested_at=timezone.now() - dt.timedelta(hours=3))

    samples = scrape(client)

    assert 3 * 3600 <= value(samples, "dlq_oldest_parked_dead_letter_age_seconds") < 3 * 3600 + 60
    assert (
        3 * 3600
        <= value(samples, "dlq_oldest_parked_age_seconds", broker="default", queue="orders.dlq")
        < 3 * 3600 + 60
    )


@pytest.mark.sqlite
def test_patterns_by_triage_status_and_reopens(client: Client) -> None:
    first = parked(1, message="Request timed out after 5ms")
    parked(1, message="Connection refused by 10.0.0.1", error_type="ConnectionError")
    FailurePattern.objects.filter(pk=first[0].pattern_id).update(status=PatternStatus.RESOLVED)
    parked(1, message="Request timed out after 7ms")

    samples = scrape(client)

    assert value(samples, "dlq_patterns", status="open") == 2
    assert value(samples, "dlq_patterns", status="resolved") == 0
    assert value(samples, "dlq_patterns_created_total") == 2
    assert value(samples, "dlq_pattern_reopens_total") == 1


def test_operation_progress_and_replay_counters(client: Client) -> None:
    Operation.objects.create(kind=OperationKind.RETRY, status=OperationStatus.DONE, total=10, succeeded=9, failed=1)
    running = Operation.objects.create(
        kind=OperationKind.RETRY, status=OperationStatus.PAUSED, total=100, succeeded=25, failed=0, returned=3
    )

    samples = scrape(client)

    assert value(samples, "dlq_operation_messages_total", kind="retry", outcome="succeeded") == 34
    assert value(samples, "dlq_operation_messages_total", kind="retry", outcome="failed") == 1
    assert value(samples, "dlq_operation_returned_total", kind="retry") == 3
    assert value(samples, "dlq_operations", kind="retry", status="paused") == 1
    labels = {"operation": str(running.pk), "kind": "retry", "status": "paused"}
    assert value(samples, "dlq_operation_progress_ratio", **labels) == 0.25
    assert value(samples, "dlq_operation_remaining_messages", **labels) == 75


def test_firing_alerts_and_notification_counters(client: Client) -> None:
    rule("dlq_not_empty", severity="critical")
    parked(1, queue="orders.dlq")
    parked(1, queue="emails.dlq")
    evaluate_rules()
    Channel.objects.create(name="hook", kind="webhook", target="http://x/", sent_count=4, failed_count=1, enabled=False)

    samples = scrape(client)

    assert Alert.objects.filter(status="firing").count() == 2
    assert value(samples, "dlq_alerts", severity="critical", status="firing") == 2
    assert value(samples, "dlq_alerts", severity="warning", status="firing") == 0
    assert value(samples, "dlq_notifications_total", kind="webhook", outcome="sent") == 4
    assert value(samples, "dlq_channels_disabled") == 1
    assert value(samples, "dlq_alert_evaluation_timestamp_seconds") > 0


def test_queue_depths_consumer_lag_and_thresholds(client: Client) -> None:
    WatchedQueue.objects.create(name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="orders.dlx")
    now = timezone.now()
    QueueSample.objects.create(queue="orders", messages=10, consumers=2, sampled_at=now - dt.timedelta(seconds=10))
    QueueSample.objects.create(queue="orders", messages=230, consumers=3, sampled_at=now)
    QueueSample.objects.create(queue="orders.dlq", messages=7, consumers=1, sampled_at=now)

    samples = scrape(client)

    assert value(samples, "dlq_queue_messages", broker="default", queue="orders", role="work") == 230
    assert value(samples, "dlq_queue_consumers", broker="default", queue="orders", role="work") == 3
    assert value(samples, "dlq_queue_messages", broker="default", queue="orders.dlq", role="dlq") == 7
    assert value(samples, "dlq_consumer_lag_messages", broker="default", queue="orders.dlq") == 7
    assert value(samples, "dlq_queue_depth_threshold", broker="default", queue="orders", level="critical") == 200


@override_settings(DLQ_METRICS_MAX_QUEUES=2)
def test_queue_labels_are_capped_and_no_label_names_a_pattern_or_message(client: Client) -> None:
    for number, count in enumerate([5, 4, 3, 2]):
        parked(count, queue=f"q{number}.dlq", message=f"failure kind {chr(65 + number)}", error_type=f"E{number}")

    samples = scrape(client)

    assert labels_of(samples, "dlq_dead_letters", "queue") == {"q0.dlq", "q1.dlq", "other"}
    assert (
        value(
            samples,
            "dlq_dead_letters",
            broker="default",
            queue="other",
            reason="TIMEOUT",
            status="parked",
            pattern_status="open",
        )
        == 5
    )
    assert value(samples, "dlq_ingest_inserted_total", broker="default", queue="other") == 5
    every_label = {label for _, key in samples for label, _ in key}
    assert not every_label & {"pattern", "pattern_id", "message", "message_id", "fingerprint"}


def test_the_collector_is_registered_once() -> None:
    register_collector()
    register_collector()

    collectors = [c for c in REGISTRY._collector_to_names if isinstance(c, DeadLetterCollector)]  # noqa: SLF001
    assert len(collectors) == 1


def test_scrape_reads_counters_not_dead_letters(client: Client, django_assert_max_num_queries) -> None:  # type: ignore[no-untyped-def]
    """The number of queries does not grow with the number of dead letters (only with queues, capped)."""
    for number in range(3):
        parked(50, queue=f"q{number}.dlq")
    settle(list(DeadLetter.objects.filter(status=DeadLetterStatus.PARKED)[:30]))

    with django_assert_max_num_queries(20):
        client.get("/metrics")


@pytest.mark.sqlite
@override_settings(DLQ_METRICS_TOKEN="scrape-token-0123456789")
def test_with_a_token_set_metrics_answer_401_without_the_bearer_token(client: Client) -> None:
    missing = client.get("/metrics")
    wrong = client.get("/metrics", headers={"Authorization": "Bearer scrape-token-012345678"})
    basic = client.get("/metrics", headers={"Authorization": "Basic c2NyYXBlLXRva2VuLTAxMjM0NTY3ODk="})
    right = client.get("/metrics", headers={"Authorization": "Bearer scrape-token-0123456789"})

    for refused in (missing, wrong, basic):
        assert refused.status_code == 401
        assert refused["WWW-Authenticate"] == 'Bearer realm="metrics"'
        assert b"dlq_" not in refused.content
    assert right.status_code == 200
    assert b"dlq_metrics_up 1.0" in right.content


@pytest.mark.sqlite
@override_settings(DLQ_METRICS_TOKEN="scrape-token-0123456789")
def test_the_bearer_scheme_is_read_without_regard_to_case(client: Client) -> None:
    response = client.get("/metrics", headers={"Authorization": "bearer scrape-token-0123456789"})

    assert response.status_code == 200


def test_the_example_prometheus_config_with_its_authorization_block_is_valid(tmp_path: Path) -> None:
    """The block is commented out in the example (Prometheus stops scraping when its token file is missing):
    switched on, with a token file beside it, promtool accepts it."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus; scripts/system-packages)")
    example = (DEPLOY / "prometheus.yml").read_text()
    block = re.search(r"^( +)# authorization:\n(?:\1#   .*\n)+", example, re.MULTILINE)
    assert block is not None, "prometheus.yml shows no authorization block"
    enabled = block[0].replace("# ", "", 1).replace("\n" + block[1] + "#   ", "\n" + block[1] + "  ")
    (tmp_path / "alerts.yml").write_text((DEPLOY / "alerts.yml").read_text())
    (tmp_path / "dlqconsole-metrics-token").write_text("scrape-token-0123456789\n")
    config = example.replace(block[0], enabled).replace(
        "/etc/prometheus/dlqconsole-metrics-token", str(tmp_path / "dlqconsole-metrics-token")
    )
    (tmp_path / "prometheus.yml").write_text(config)

    result = subprocess.run(
        ["promtool", "check", "config", "prometheus.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )

    assert "authorization:\n" in config and "credentials_file: " + str(tmp_path) in config
    assert result.returncode == 0, result.stdout + result.stderr


def two_brokers() -> Broker:
    """The broker staging beside default, each with a watched `orders` and dead letters in `orders.dlq`."""
    staging = Broker.objects.create(name="staging", url="amqp://guest@127.0.0.1:5672/staging")
    parked(2, queue="orders.dlq")
    store(*ParsedDeadLetterFactory.build_batch(3, source_queue="orders.dlq", broker_id=staging.pk))
    now = timezone.now()
    for broker, depth in ((None, 10), (staging, 40)):
        fields = {"broker": broker} if broker else {}
        WatchedQueue.objects.create(name="orders", dead_letter_queue="orders.dlq", dead_letter_exchange="x", **fields)
        QueueSample.objects.create(queue="orders", messages=depth, consumers=1, sampled_at=now, **fields)
    return staging


def test_the_same_queue_on_two_brokers_is_two_series_told_apart_by_the_broker_label(client: Client) -> None:
    two_brokers()

    samples = scrape(client)

    cell = {"queue": "orders.dlq", "reason": "TIMEOUT", "status": "parked", "pattern_status": "open"}
    assert value(samples, "dlq_dead_letters", broker="default", **cell) == 2
    assert value(samples, "dlq_dead_letters", broker="staging", **cell) == 3
    assert value(samples, "dlq_ingest_inserted_total", broker="default", queue="orders.dlq") == 2
    assert value(samples, "dlq_ingest_inserted_total", broker="staging", queue="orders.dlq") == 3
    assert value(samples, "dlq_queue_messages", broker="default", queue="orders", role="work") == 10
    assert value(samples, "dlq_queue_messages", broker="staging", queue="orders", role="work") == 40
    assert value(samples, "dlq_queue_depth_threshold", broker="staging", queue="orders", level="warning") == 50
    assert value(samples, "dlq_oldest_parked_age_seconds", broker="staging", queue="orders.dlq") >= 0
    # Every series that names a queue names its broker.
    for (name, key), _ in samples.items():
        labels = dict(key)
        assert "queue" not in labels or labels.get("broker") in {"default", "staging"}, name


@override_settings(DLQ_METRICS_MAX_QUEUES=3)
def test_the_cap_counts_broker_and_queue_pairs_and_sums_the_rest_per_broker(client: Client) -> None:
    two_brokers()  # the watched pairs come first: (default, orders), (default, orders.dlq), (staging, orders) ...

    samples = scrape(client)

    cell = {"reason": "TIMEOUT", "status": "parked", "pattern_status": "open"}
    assert value(samples, "dlq_dead_letters", broker="default", queue="orders.dlq", **cell) == 2
    assert value(samples, "dlq_dead_letters", broker="staging", queue="other", **cell) == 3
    assert value(samples, "dlq_ingest_inserted_total", broker="staging", queue="other") == 3
    staging_queues = {
        dict(key)["queue"] for name, key in samples if name == "dlq_dead_letters" and ("broker", "staging") in key
    }
    assert staging_queues == {"other"}


def test_breaker_states_by_destination(client: Client) -> None:
    name = f"orders-{uuid.uuid4().hex[:8]}"
    breakers = get_breakers()
    breakers.record(f"queue:{name}", [Event(NACK)] * 50, config=BreakerConfig.from_settings())
    BreakerSetting.objects.create(queue=f"{name}-quiet")
    try:
        samples = scrape(client)
    finally:
        breakers.close(f"queue:{name}")

    assert samples[("dlq_breaker_state", (("destination", f"queue:{name}"),))] == 2
    assert samples[("dlq_breaker_state", (("destination", f"queue:{name}-quiet"),))] == 0


def test_forged_breakers_do_not_push_the_awaited_and_configured_ones_out(client: Client) -> None:
    breakers = get_breakers()
    config = BreakerConfig.from_settings()
    for number in range(MAX_BREAKERS + 5):
        breakers.record(f"queue:!forged-{number:03d}", [Event(NACK)] * config.failures, config=config)
    name = f"orders-{uuid.uuid4().hex[:8]}"
    breakers.record(f"queue:{name}", [Event(NACK)] * config.failures, config=config)
    BreakerSetting.objects.create(queue=f"{name}-set")

    samples = scrape(client)

    assert samples[("dlq_breaker_state", (("destination", f"queue:{name}-set"),))] == 0
    shown = [key for metric, key in samples if metric == "dlq_breaker_state"]
    assert len(shown) == MAX_BREAKERS
    assert samples[("dlq_breakers_not_shown", ())] == MAX_BREAKERS + 5 + 2 - MAX_BREAKERS
