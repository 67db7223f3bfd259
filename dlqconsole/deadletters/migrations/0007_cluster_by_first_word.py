"""Clusters keyed by first word instead of token count (template mining now merges across token counts).

The existing text fingerprints move to the cluster of their (error type, failure reason, first word); the old
clusters go. Patterns stay as they are: the next new fingerprint of a cluster has it mined again as a whole.
The first-word rule and the key are written out here as they were when this migration was made.
"""

import hashlib
from collections import Counter

from django.db import migrations, models


def _anchor(tokens):  # type: ignore[no-untyped-def]
    for token in tokens:
        if str(token).lstrip()[:1].isalpha():
            return str(token).strip()
    return ""


def _key(error_type, reason, anchor):  # type: ignore[no-untyped-def]
    return hashlib.sha1(f"{error_type}\x00{reason}\x00word\x00{anchor}".encode(), usedforsecurity=False).hexdigest()


def cluster_by_first_word(apps, schema_editor):  # type: ignore[no-untyped-def]
    PatternCluster = apps.get_model("deadletters", "PatternCluster")
    Fingerprint = apps.get_model("deadletters", "Fingerprint")
    old = {cluster.pk: cluster for cluster in PatternCluster.objects.all()}
    if not old:
        return
    new_ids: dict[str, int] = {}
    sizes: Counter[int] = Counter()
    moved = []
    for fingerprint in Fingerprint.objects.filter(cluster__isnull=False).only("pk", "cluster_id", "tokens").iterator():
        cluster = old[fingerprint.cluster_id]
        anchor = _anchor(fingerprint.tokens or [])
        key = _key(cluster.error_type, cluster.failure_reason, anchor)
        if key not in new_ids:
            created, _ = PatternCluster.objects.get_or_create(
                key=key,
                defaults={
                    "error_type": cluster.error_type,
                    "failure_reason": cluster.failure_reason,
                    "anchor": anchor[:255],
                    "token_count": 0,  # removed by the next migration
                    "created_at": cluster.created_at,
                },
            )
            new_ids[key] = created.pk
        fingerprint.cluster_id = new_ids[key]
        moved.append(fingerprint)
        sizes[new_ids[key]] += 1
    Fingerprint.objects.bulk_update(moved, ["cluster"], batch_size=1000)
    for pk, size in sizes.items():
        PatternCluster.objects.filter(pk=pk).update(size=size)
    PatternCluster.objects.filter(pk__in=list(old)).exclude(pk__in=list(new_ids.values())).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("deadletters", "0006_drop_replaying_status"),
    ]

    operations = [
        migrations.AddField(
            model_name="patterncluster",
            name="anchor",
            field=models.CharField(blank=True, help_text="The first word of its messages.", max_length=255),
        ),
        migrations.RunPython(cluster_by_first_word, migrations.RunPython.noop),
    ]
