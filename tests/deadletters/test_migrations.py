"""Data migrations on a database that holds rows from before them (real PostgreSQL, migrated back and forth)."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]

BEFORE = [("deadletters", "0006_drop_replaying_status")]
AFTER = [("deadletters", "0008_remove_patterncluster_token_count")]


def test_clusters_keyed_by_token_count_become_clusters_keyed_by_first_word(migrate: Any) -> None:
    old = migrate(BEFORE)
    Cluster = old.get_model("deadletters", "PatternCluster")
    Fingerprint = old.get_model("deadletters", "Fingerprint")
    Pattern = old.get_model("deadletters", "FailurePattern")
    four = Cluster.objects.create(key="a" * 40, error_type="KeyError", failure_reason="NOT_FOUND", token_count=4)
    five = Cluster.objects.create(key="b" * 40, error_type="KeyError", failure_reason="NOT_FOUND", token_count=5)
    pattern = Pattern.objects.create(key="p1", template="user <*> not found", error_type="KeyError")
    rows = [
        ("f1", ["user", " bob", " not", " found"], four),
        ("f2", ["user", " John", " Smith", " not", " found"], five),
        ("f3", ["order", " <ID>", " not", " found"], four),
    ]
    for key, tokens, cluster in rows:
        Fingerprint.objects.create(
            key=key, template="".join(tokens), tokens=tokens, cluster=cluster, pattern=pattern, error_type="KeyError"
        )

    new = migrate(AFTER)

    Cluster = new.get_model("deadletters", "PatternCluster")
    Fingerprint = new.get_model("deadletters", "Fingerprint")
    clusters = {cluster.anchor: cluster for cluster in Cluster.objects.all()}
    assert set(clusters) == {"user", "order"}  # the token-count clusters are gone
    assert {cluster.size for cluster in clusters.values()} == {2, 1}
    by_key = {fingerprint.key: fingerprint.cluster_id for fingerprint in Fingerprint.objects.all()}
    assert by_key == {"f1": clusters["user"].pk, "f2": clusters["user"].pk, "f3": clusters["order"].pk}
    kinds = {(cluster.error_type, cluster.failure_reason) for cluster in clusters.values()}
    assert kinds == {("KeyError", "NOT_FOUND")}
