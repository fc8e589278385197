"""event_decision and event_approval hold only the events that carry the id (issue 12).

Every event is one insert into each index of runs_event, and the seven events of a dispatched
call carry no approval (none asked) and no decision (unless the agent named one): two of their
index entries were blank strings no look-up reads. A look-up of an id (`= 'apr_…'`, a
constant) implies `<> ''`, so it still reads the partial index.
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0017_event_tenant_no_db_fk"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="event",
            name="event_decision",
        ),
        migrations.RemoveIndex(
            model_name="event",
            name="event_approval",
        ),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(
                condition=models.Q(("decision_id", ""), _negated=True),
                fields=["decision_id"],
                name="event_decision",
            ),
        ),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(
                condition=models.Q(("approval_id", ""), _negated=True),
                fields=["approval_id"],
                name="event_approval",
            ),
        ),
    ]
