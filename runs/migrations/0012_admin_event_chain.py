"""Admin events get their own hash chain per tenant (runs/admin_events.py): the rows already
written are chained in the order they happened, then (tenant, seq) is made unique."""

import django.utils.timezone
from django.db import migrations, models

from runs.events import GENESIS_HASH, hash_body, iso


def chain_existing(apps, schema_editor):
    AdminEvent = apps.get_model("runs", "AdminEvent")
    tenant, seq, prev = None, 0, GENESIS_HASH
    for event in AdminEvent.objects.order_by("tenant_id", "occurred_at", "id"):
        if event.tenant_id != tenant:
            tenant, seq, prev = event.tenant_id, 0, GENESIS_HASH
        seq += 1
        # The body of runs.admin_events.admin_event_hash, as it is today.
        event.seq, event.prev_hash = seq, prev
        event.hash = hash_body(
            {
                "id": event.id,
                "tenant": event.tenant_id,
                "seq": event.seq,
                "type": event.event_type,
                "schema_version": event.schema_version,
                "actor": event.actor,
                "subject": event.subject,
                "occurred_at": iso(event.occurred_at),
                "payload": event.payload,
                "prev_hash": event.prev_hash,
            }
        )
        event.save(update_fields=["seq", "prev_hash", "hash"])
        prev = event.hash


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0011_run_end_credentials_archive"),
    ]

    operations = [
        migrations.AddField(
            model_name="adminevent",
            name="seq",
            field=models.PositiveIntegerField(default=0),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="adminevent",
            name="prev_hash",
            field=models.CharField(default="", max_length=64),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="adminevent",
            name="hash",
            field=models.CharField(default="", max_length=64),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name="adminevent",
            name="occurred_at",
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
        migrations.RunPython(chain_existing, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name="adminevent",
            index=models.Index(fields=["tenant", "occurred_at"], name="adminevent_tenant_time"),
        ),
        migrations.AddConstraint(
            model_name="adminevent",
            constraint=models.UniqueConstraint(
                fields=("tenant", "seq"), name="adminevent_unique_seq"
            ),
        ),
    ]
