"""Two writes every engine cycle made that changed nothing anyone reads (issue 38).

- **An interrupt's search document is written again only when its words change.** The trigger
  rebuilt it on every decision, though an answer of only true or false with no reason (most
  approvals) adds no word: SQLite deleted the row from its full-text index and inserted it again,
  PostgreSQL computed the same tsvector. Now the update trigger fires when the message, the
  reason or the data changed, or the answer's words did (an empty comment is none). SQLite's
  document leaves out true and false (it held them as 1 and 0), as PostgreSQL's always did
  (``jsonb_to_tsvector`` over strings and numbers), and is rebuilt once here so that every row
  is written the same way. The status, which is no part of the document, no longer fires it.
- **RunEvent's index on ``run_id`` alone is dropped.** ``runevent_run_seq`` (run_id, seq)
  serves every lookup by run (a run's events, the cascade as a run is deleted); each event was
  written into both. Dropped by name (if a site has not dropped it already): on SQLite Django's
  AlterField would remake the table, and with it drop the audit chain's trigger on it."""

from django.db import migrations, models

# As in 0015, with true and false left out of the document (null never was in it).
WORDS = "type IN ('text', 'integer', 'real')"
SQLITE_DOCUMENT = f"""
    SELECT i.id, i.message || ' ' || i.reason
        || ' ' || COALESCE((SELECT group_concat(value, ' ') FROM json_tree(i.data) WHERE {WORDS}), '')
        || ' ' || COALESCE((SELECT group_concat(value, ' ') FROM json_tree(i.answer) WHERE {WORDS}), '')
        || ' ' || COALESCE((SELECT group_concat(value, ' ') FROM json_tree(r.input) WHERE {WORDS}), '')
        || ' ' || COALESCE((SELECT group_concat(c.body, ' ') FROM actions_comment c WHERE c.interrupt_id = i.id), '')
    FROM actions_interrupt i JOIN actions_run r ON r.id = i.run_id WHERE i.id = {{target}}
"""


def _sqlite_triggers(document: str, update_when: str, update_of: str) -> list[str]:
    return [
        "DROP TRIGGER actions_interrupt_search_insert",
        "DROP TRIGGER actions_interrupt_search_update",
        "DROP TRIGGER actions_interrupt_search_comment",
        f"""CREATE TRIGGER actions_interrupt_search_insert AFTER INSERT ON actions_interrupt BEGIN
        INSERT INTO actions_interrupt_search (rowid, document) {document.format(target="NEW.id")};
    END""",
        f"""CREATE TRIGGER actions_interrupt_search_update
        AFTER UPDATE OF {update_of} ON actions_interrupt {update_when} BEGIN
        DELETE FROM actions_interrupt_search WHERE rowid = NEW.id;
        INSERT INTO actions_interrupt_search (rowid, document) {document.format(target="NEW.id")};
    END""",
        f"""CREATE TRIGGER actions_interrupt_search_comment AFTER INSERT ON actions_comment BEGIN
        DELETE FROM actions_interrupt_search WHERE rowid = NEW.interrupt_id;
        INSERT INTO actions_interrupt_search (rowid, document) {document.format(target="NEW.interrupt_id")};
    END""",
        "DELETE FROM actions_interrupt_search",
        f"INSERT INTO actions_interrupt_search (rowid, document) {document.format(target='i.id')}",
    ]


def _answer_words(row: str) -> str:
    # As the document joins them in: no words and an empty string alike.
    return f"COALESCE((SELECT group_concat(value, ' ') FROM json_tree({row}.answer) WHERE {WORDS}), '')"


SQLITE = _sqlite_triggers(
    SQLITE_DOCUMENT,
    "WHEN NEW.message IS NOT OLD.message OR NEW.reason IS NOT OLD.reason OR NEW.data IS NOT OLD.data"
    f" OR (NEW.answer IS NOT OLD.answer AND {_answer_words('NEW')} IS NOT {_answer_words('OLD')})",
    "message, data, answer, reason",
)
# Back to 0015's triggers and document.
SQLITE_BACK = _sqlite_triggers(
    SQLITE_DOCUMENT.replace(WORDS, "atom IS NOT NULL"), "", "message, data, answer, reason, status"
)


POSTGRESQL = [
    # Whether two answers' words differ, as grundlag_index_interrupt reads them. An answer over
    # tsvector's limit (1 MB of words: a payload limit raised that far) is said to differ, and
    # the index function makes its document of what fits, as it always did, instead of the
    # decision failing here.
    """CREATE FUNCTION grundlag_answer_words_differ(before jsonb, after jsonb) RETURNS boolean
    LANGUAGE plpgsql STABLE AS $$
    BEGIN
        RETURN jsonb_to_tsvector('simple', COALESCE(before, '{}'::jsonb), '["string", "numeric"]')
            IS DISTINCT FROM jsonb_to_tsvector('simple', COALESCE(after, '{}'::jsonb), '["string", "numeric"]');
    EXCEPTION WHEN program_limit_exceeded THEN
        RETURN true;
    END
    $$""",
    "DROP TRIGGER actions_interrupt_search ON actions_interrupt",
    """CREATE TRIGGER actions_interrupt_search AFTER INSERT
        ON actions_interrupt FOR EACH ROW EXECUTE FUNCTION grundlag_index_interrupt_row()""",
    """CREATE TRIGGER actions_interrupt_search_update AFTER UPDATE OF message, data, answer, reason
        ON actions_interrupt FOR EACH ROW
        WHEN (NEW.message IS DISTINCT FROM OLD.message OR NEW.reason IS DISTINCT FROM OLD.reason
            OR NEW.data IS DISTINCT FROM OLD.data
            OR (NEW.answer IS DISTINCT FROM OLD.answer AND grundlag_answer_words_differ(OLD.answer, NEW.answer)))
        EXECUTE FUNCTION grundlag_index_interrupt_row()""",
]
POSTGRESQL_BACK = [
    "DROP TRIGGER actions_interrupt_search_update ON actions_interrupt",
    "DROP TRIGGER actions_interrupt_search ON actions_interrupt",
    """CREATE TRIGGER actions_interrupt_search AFTER INSERT OR UPDATE OF message, data, answer, reason, status
        ON actions_interrupt FOR EACH ROW EXECUTE FUNCTION grundlag_index_interrupt_row()""",
    "DROP FUNCTION grundlag_answer_words_differ(jsonb, jsonb)",
]

# The name Django gave the foreign key's index (the same on both databases).
RUN_INDEX = "actions_runevent_run_id_2fa08eb6"


def _run(statements):
    def run(apps, schema_editor):
        for statement in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("actions", "0026_gateway_receipts"),
    ]

    operations = [
        migrations.RunPython(
            _run({"sqlite": SQLITE, "postgresql": POSTGRESQL}),
            _run({"sqlite": SQLITE_BACK, "postgresql": POSTGRESQL_BACK}),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="runevent",
                    name="run",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="events",
                        to="actions.run",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{RUN_INDEX}"',
                    f'CREATE INDEX IF NOT EXISTS "{RUN_INDEX}" ON "actions_runevent" ("run_id")',
                ),
            ],
        ),
    ]
