-- The reconciler's queue: a row for every effect a claim may take, now or later, and for no
-- other, so that a claim reads the front of `reconcile_due_at` (what it claims) instead of
-- ordering the whole backlog. See the PostgreSQL file of the same name for what each column
-- means and why; the triggers here are that file's functions, written out per case.
CREATE TABLE reconcile_due (
    effect_id  INTEGER PRIMARY KEY,
    tenant_id  INTEGER NOT NULL,
    opens_at   REAL NOT NULL,
    due_at     REAL NOT NULL
);
CREATE INDEX reconcile_due_at ON reconcile_due (tenant_id, due_at);

-- `max` of several values is NULL when one is: the state's lease is coalesced. A row is
-- replaced by a delete and an insert: a trigger's `OR REPLACE` gives way to the conflict
-- handling of the statement that fired it (ingest's upsert).
CREATE TRIGGER effect_enters_due AFTER INSERT ON effect
    WHEN NOT NEW.resolved AND (NEW.state = 'unknown'
         OR (NEW.state = 'in_progress' AND NEW.gone_at IS NULL AND NEW.abandoned_at IS NOT NULL))
BEGIN
    INSERT INTO reconcile_due (effect_id, tenant_id, opens_at, due_at)
        VALUES (NEW.id, NEW.tenant_id,
                CASE WHEN NEW.state = 'unknown' THEN 0.0 ELSE NEW.abandoned_at END,
                CASE WHEN NEW.state = 'unknown' THEN 0.0 ELSE NEW.abandoned_at END);
END;
CREATE TRIGGER effect_stays_due AFTER UPDATE OF state, gone_at, resolved, abandoned_at ON effect
    WHEN NOT NEW.resolved AND (NEW.state = 'unknown'
         OR (NEW.state = 'in_progress' AND NEW.gone_at IS NULL AND NEW.abandoned_at IS NOT NULL))
BEGIN
    DELETE FROM reconcile_due WHERE effect_id = NEW.id;
    INSERT INTO reconcile_due (effect_id, tenant_id, opens_at, due_at)
        SELECT NEW.id, NEW.tenant_id, o.opens,
               max(o.opens, COALESCE(s.next_attempt_at, o.opens), COALESCE(s.lease_until, o.opens))
        FROM (SELECT CASE WHEN NEW.state = 'unknown' THEN 0.0 ELSE NEW.abandoned_at END AS opens) o
        LEFT JOIN reconcile_state s ON s.effect_id = NEW.id;
END;
CREATE TRIGGER effect_leaves_due AFTER UPDATE OF state, gone_at, resolved, abandoned_at ON effect
    WHEN NOT (NOT NEW.resolved AND (NEW.state = 'unknown'
         OR (NEW.state = 'in_progress' AND NEW.gone_at IS NULL AND NEW.abandoned_at IS NOT NULL)))
BEGIN
    DELETE FROM reconcile_due WHERE effect_id = NEW.id;
END;

CREATE TRIGGER reconcile_state_schedules_due AFTER INSERT ON reconcile_state
BEGIN
    UPDATE reconcile_due
        SET due_at = max(opens_at, NEW.next_attempt_at, COALESCE(NEW.lease_until, opens_at))
        WHERE effect_id = NEW.effect_id;
END;
CREATE TRIGGER reconcile_state_reschedules_due
    AFTER UPDATE OF next_attempt_at, lease_until ON reconcile_state
    WHEN OLD.next_attempt_at IS NOT NEW.next_attempt_at OR OLD.lease_until IS NOT NEW.lease_until
BEGIN
    UPDATE reconcile_due
        SET due_at = max(opens_at, NEW.next_attempt_at, COALESCE(NEW.lease_until, opens_at))
        WHERE effect_id = NEW.effect_id;
END;

-- The effects open now.
INSERT INTO reconcile_due (effect_id, tenant_id, opens_at, due_at)
    SELECT id, tenant_id, opens, max(opens, COALESCE(next_at, opens), COALESCE(lease, opens))
    FROM (SELECT e.id, e.tenant_id,
                 CASE WHEN e.state = 'unknown' THEN 0.0 ELSE e.abandoned_at END AS opens,
                 s.next_attempt_at AS next_at, s.lease_until AS lease
          FROM effect e LEFT JOIN reconcile_state s ON s.effect_id = e.id
          WHERE (e.state = 'unknown' OR (e.state = 'in_progress' AND e.gone_at IS NULL))
            AND NOT e.resolved)
    WHERE opens IS NOT NULL;
