-- The reconciler's queue: a row for every effect a claim may take, now or later, and for no
-- other. A claim read the backlog itself, every open effect of the tenant joined to its
-- reconcile state and ordered by when it is due, to take 32 (57 ms at 100,000 unresolved);
-- it now reads the front of `reconcile_due_at`, a range of the index: what it claims.
--
-- An effect is in the queue while it is unknown, or a claim in progress that is not gone
-- and will be abandoned (`abandoned_at`), and has no resolution: the backlog of 0023.
-- `opens_at` is when a claim may first take it (0 for unknown, `abandoned_at` for a claim
-- in progress: abandoned claims become due by time, not by a write), and `due_at` the
-- latest of that, its next attempt and its lease's end: a claim takes exactly the rows with
-- `due_at <= now`, as the old predicate did (due, lease free, abandoned by now).
--
-- Kept by the database, like `resolved` and `parked`: the effect's triggers add, move or
-- remove its row whenever its state, gone mark, resolution or abandonment changes (ingest,
-- scans, pushes, verdicts and their retraction alike), the reconcile state's whenever its
-- schedule or lease does. No foreign keys: an insert would lock the tenant's and the
-- effect's rows for each (0002 dropped the effect's for that); the rows follow the effect.
CREATE TABLE reconcile_due (
    effect_id  BIGINT PRIMARY KEY,
    tenant_id  BIGINT NOT NULL,
    opens_at   DOUBLE PRECISION NOT NULL,
    due_at     DOUBLE PRECISION NOT NULL
);
CREATE INDEX reconcile_due_at ON reconcile_due (tenant_id, due_at, effect_id);

ALTER TABLE reconcile_due ENABLE ROW LEVEL SECURITY;
ALTER TABLE reconcile_due FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON reconcile_due
    USING (tenant_id = reckon_current_tenant())
    WITH CHECK (tenant_id = reckon_current_tenant());
GRANT SELECT, INSERT, UPDATE, DELETE ON reconcile_due TO reckon_app;

CREATE FUNCTION reckon_keep_due() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    opens DOUBLE PRECISION;
BEGIN
    IF NOT NEW.resolved THEN
        IF NEW.state = 'unknown' THEN
            opens := 0;
        ELSIF NEW.state = 'in_progress' AND NEW.gone_at IS NULL THEN
            opens := NEW.abandoned_at;
        END IF;
    END IF;
    IF opens IS NULL THEN
        IF TG_OP = 'UPDATE' THEN
            DELETE FROM reconcile_due WHERE effect_id = NEW.id;
        END IF;
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO reconcile_due (effect_id, tenant_id, opens_at, due_at)
            VALUES (NEW.id, NEW.tenant_id, opens, opens);
    ELSE
        -- Over no state row the aggregates are NULL, which GREATEST leaves out.
        INSERT INTO reconcile_due (effect_id, tenant_id, opens_at, due_at)
            SELECT NEW.id, NEW.tenant_id, opens,
                   GREATEST(opens, MAX(s.next_attempt_at), MAX(s.lease_until))
            FROM reconcile_state s WHERE s.effect_id = NEW.id
        ON CONFLICT (effect_id) DO UPDATE
            SET opens_at = excluded.opens_at, due_at = excluded.due_at;
    END IF;
    RETURN NULL;
END $$;
-- A new effect that opens nothing (most: they succeeded) costs the WHEN test alone.
CREATE TRIGGER effect_enters_due AFTER INSERT ON effect FOR EACH ROW
    WHEN (NOT NEW.resolved AND (NEW.state = 'unknown'
          OR (NEW.state = 'in_progress' AND NEW.gone_at IS NULL AND NEW.abandoned_at IS NOT NULL)))
    EXECUTE FUNCTION reckon_keep_due();
CREATE TRIGGER effect_moves_due AFTER UPDATE OF state, gone_at, resolved, abandoned_at ON effect
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.gone_at IS DISTINCT FROM NEW.gone_at
          OR OLD.resolved IS DISTINCT FROM NEW.resolved
          OR OLD.abandoned_at IS DISTINCT FROM NEW.abandoned_at)
    EXECUTE FUNCTION reckon_keep_due();

CREATE FUNCTION reckon_schedule_due() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE reconcile_due SET due_at = GREATEST(opens_at, NEW.next_attempt_at, NEW.lease_until)
        WHERE effect_id = NEW.effect_id;
    RETURN NULL;
END $$;
CREATE TRIGGER reconcile_state_schedules_due AFTER INSERT ON reconcile_state
    FOR EACH ROW EXECUTE FUNCTION reckon_schedule_due();
CREATE TRIGGER reconcile_state_reschedules_due
    AFTER UPDATE OF next_attempt_at, lease_until ON reconcile_state FOR EACH ROW
    WHEN (OLD.next_attempt_at IS DISTINCT FROM NEW.next_attempt_at
          OR OLD.lease_until IS DISTINCT FROM NEW.lease_until)
    EXECUTE FUNCTION reckon_schedule_due();

-- The effects open now, each tenant's inside its own scope (row-level security applies to
-- the migrating owner too), through the backlog's index.
DO $$
DECLARE
    t BIGINT;
BEGIN
    FOR t IN SELECT id FROM tenant LOOP
        PERFORM set_config('reckon.tenant', t::text, true);
        INSERT INTO reconcile_due (effect_id, tenant_id, opens_at, due_at)
            SELECT e.id, e.tenant_id, o.opens,
                   GREATEST(o.opens, s.next_attempt_at, s.lease_until)
            FROM effect e
            CROSS JOIN LATERAL (SELECT CASE WHEN e.state = 'unknown' THEN 0::float8
                                            ELSE e.abandoned_at END AS opens) o
            LEFT JOIN reconcile_state s ON s.effect_id = e.id
            WHERE e.tenant_id = t
              AND (e.state = 'unknown' OR (e.state = 'in_progress' AND e.gone_at IS NULL))
              AND NOT e.resolved AND o.opens IS NOT NULL;
    END LOOP;
    PERFORM set_config('reckon.tenant', '', true);
END
$$;
ANALYZE reconcile_due;
