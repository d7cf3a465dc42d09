"""PostgreSQL writes a transaction's journal in one round trip: ``grundlag_append_journal``
takes the chain's head (locked), chains and inserts the transaction's events, and moves the
teams' inbox streams on (actions.engine.audit.append). Before, that was three statements at the
end of every engine transaction, each a round trip to the server: a third of a cycle's.

The hashes are the ones actions.engine.audit computes (and ``verify()`` recomputes): each
event's ``hash`` is SHA-256 of the previous head's hex text followed by the event's content,
and ``run_hash`` the same over its run's previous ``run_hash``. The content is
``[<seq>`` followed by the rest, which Python writes (JSON, ASCII only), as it always did.
Nothing on SQLite, whose engine runs in the process that writes."""

from django.db import migrations

CREATE = [
    """CREATE FUNCTION grundlag_append_journal(events jsonb, stream_teams bigint[], stream_counts bigint[])
    RETURNS TABLE (o_team bigint, o_seq bigint) LANGUAGE plpgsql AS $$
    DECLARE
        genesis constant text := repeat('0', 64);
        chain_seq bigint;
        chain_head text;
        event jsonb;
        body bytea;
        v_run bigint;
        previous text;
        run_heads jsonb := '{}';
        stream record;
    BEGIN
        IF jsonb_array_length(events) > 0 THEN
            SELECT c.seq, c.head INTO chain_seq, chain_head FROM actions_auditchain c WHERE c.id = 1 FOR UPDATE;
            IF NOT FOUND THEN  -- a database emptied by hand (a test's flush): the chain starts again
                INSERT INTO actions_auditchain (id, seq, head) VALUES (1, 0, genesis);
                chain_seq := 0;
                chain_head := genesis;
            END IF;
            FOR event IN SELECT value FROM jsonb_array_elements(events) LOOP
                chain_seq := chain_seq + 1;
                v_run := (event->>0)::bigint;
                body := convert_to('[' || chain_seq::text || (event->>7), 'UTF8');
                chain_head := encode(sha256(convert_to(chain_head, 'UTF8') || body), 'hex');
                previous := run_heads->>(v_run::text);
                IF previous IS NULL THEN
                    SELECT e.run_hash INTO previous FROM actions_runevent e
                        WHERE e.run_id = v_run AND e.seq IS NOT NULL ORDER BY e.seq DESC LIMIT 1;
                    previous := COALESCE(previous, genesis);
                END IF;
                previous := encode(sha256(convert_to(previous, 'UTF8') || body), 'hex');
                run_heads := run_heads || jsonb_build_object(v_run::text, previous);
                INSERT INTO actions_runevent
                    (run_id, interrupt_id, kind, actor_id, actor_name, detail, at, seq, hash, run_hash)
                VALUES (
                    v_run, (event->>1)::bigint, event->>2, (event->>3)::integer, event->>4,
                    CASE WHEN jsonb_typeof(event->5) = 'null' THEN NULL ELSE event->5 END,
                    (event->>6)::timestamptz, chain_seq, chain_head, previous
                );
            END LOOP;
        END IF;
        -- Teams in id order, so that two transactions never wait for each other's.
        FOR stream IN
            INSERT INTO actions_inboxstream AS s (team_id, seq)
                SELECT t, n FROM unnest(stream_teams, stream_counts) AS u (t, n) ORDER BY t
            ON CONFLICT (team_id) DO UPDATE SET seq = s.seq + excluded.seq
            RETURNING s.team_id, s.seq
        LOOP
            o_team := stream.team_id;
            o_seq := stream.seq;
            RETURN NEXT;
        END LOOP;
    END
    $$""",
]
DROP = ["DROP FUNCTION grundlag_append_journal(jsonb, bigint[], bigint[])"]


def _run(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for statement in statements:
                schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ("actions", "0020_interrupt_traceparent"),
    ]

    operations = [
        migrations.RunPython(_run(CREATE), _run(DROP)),
    ]
