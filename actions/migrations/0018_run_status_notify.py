"""PostgreSQL tells its listeners of every change of a run's status, whoever makes it: a trigger
NOTIFYs ``id:status`` on the channel the web processes LISTEN on (actions.web.waiting), as the
transaction commits, and never if it rolls back. Before, the engine sent the NOTIFY itself, one
more statement in each transaction that changed a status. Nothing on SQLite (one process)."""

from django.db import migrations

CREATE = [
    """CREATE FUNCTION grundlag_notify_run_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('grundlag_run_changed', NEW.id::text || ':' || NEW.status);
        RETURN NULL;
    END
    $$""",
    """CREATE TRIGGER actions_run_started_notify AFTER INSERT ON actions_run
        FOR EACH ROW EXECUTE FUNCTION grundlag_notify_run_changed()""",
    # Not when only the lease moves (a worker's heartbeat) or the row is rewritten unchanged.
    """CREATE TRIGGER actions_run_status_notify AFTER UPDATE OF status ON actions_run
        FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
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
