"""Drop the database FOREIGN KEY of an event's tenant (issue 12 point 1: PostgreSQL's CPU per call).

Each event row's deferred RI trigger ran `SELECT 1 FROM ONLY runs_tenant … FOR KEY SHARE` at
commit: about seven per dispatched call, for what the event's run key (kept) already holds —
runs.events.append copies the tenant from the run. The reason is on the field (runs/models.py).
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0016_drop_unused_indexes"),
    ]

    operations = [
        migrations.AlterField(
            model_name="event",
            name="tenant",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="events",
                to="runs.tenant",
            ),
        ),
    ]
