"""The token count no longer keys a cluster (see 0007); a migration of its own, so that the table is altered after
the data step's transaction has committed."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("deadletters", "0007_cluster_by_first_word"),
    ]

    operations = [
        migrations.RemoveField(
            model_name="patterncluster",
            name="token_count",
        ),
    ]
