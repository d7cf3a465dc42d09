"""PostgreSQL tells its listeners when a run settles, whoever settles it: a trigger NOTIFYs
``id:status`` on the channel the web processes LISTEN on (actions.live.waiting), as the
transaction commits, and never if it rolls back. Before, the engine sent the NOTIFY itself, one
more statement in each transaction that changed a status. Nothing on SQLite (one process).

Only the statuses a request waits for (Run.SETTLED: paused or finished), and only when the
status changes: not a claim or a requeue, not a heartbeat that moves the lease. A NOTIFY takes a
lock that the committing transactions of the whole cluster share."""

from django.db import migrations

SETTLED = "('interrupted', 'completed', 'failed', 'rejected', 'cancelled')"  # Run.SETTLED

CREATE = [
    """CREATE FUNCTION grundlag_notify_run_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('grundlag_run_changed', NEW.id::text || ':' || NEW.status);
        RETURN NULL;
    END
    $$""",
    f"""CREATE TRIGGER actions_run_started_notify AFTER INSERT ON actions_run
        FOR EACH ROW WHEN (NEW.status IN {SETTLED})
        EXECUTE FUNCTION grundlag_notify_run_changed()""",
    f"""CREATE TRIGGER actions_run_status_notify AFTER UPDATE OF status ON actions_run
        FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status IN {SETTLED})
        EXECUTE FUNCTION grundlag_notify_run_changed()""",
]
DROP = [
    "DROP TRIGGER actions_run_status_notify ON actions_run",
    "DROP TRIGGER actions_run_started_notify ON actions_run",
    "DROP FUNCTION grundlag_notify_run_changed()",
]


def _run(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for statement in statements:
                schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ("actions", "0017_integration"),
    ]

    operations = [
        migrations.RunPython(_run(CREATE), _run(DROP)),
    ]
