-- Verdicts are decided on money, over payments read as they are now. Ledgers that
-- concluded `applied` under the earlier rule ("an object was found", a snapshot or a
-- declined attempt would do, no check for a second payment) lose those verdicts here: each
-- such resolution is kept in resolution_retracted, taken off the effect, and the effect
-- is due for a re-check at once, shown as provisional until it gets one. A verdict of the
-- new rule always carries a certificate (its complete check); these carry none.
-- Resolutions already written back stay: the application has acted on them (their
-- write-back log says so) and a person must look.
CREATE TABLE resolution_retracted (
    id             INTEGER PRIMARY KEY,
    tenant_id      INTEGER NOT NULL REFERENCES tenant(id),
    effect_id      INTEGER NOT NULL REFERENCES effect(id),
    resolution_id  INTEGER NOT NULL,
    outcome        TEXT NOT NULL,
    author         TEXT NOT NULL,
    evidence       TEXT NOT NULL,
    attempt_id     INTEGER,
    resolved_at    REAL NOT NULL,
    retracted_at   REAL NOT NULL,
    reason         TEXT NOT NULL
);
CREATE INDEX resolution_retracted_effect ON resolution_retracted (tenant_id, effect_id);

CREATE TEMP TABLE verdicts_to_retract AS
    SELECT r.id FROM resolution r
    WHERE r.author = 'reconciler' AND r.outcome = 'applied'
      AND json_extract(r.evidence, '$.classification.certificate') IS NULL
      AND NOT EXISTS (SELECT 1 FROM writeback w WHERE w.resolution_id = r.id);

INSERT INTO resolution_retracted (tenant_id, effect_id, resolution_id, outcome, author,
        evidence, attempt_id, resolved_at, retracted_at, reason)
    SELECT r.tenant_id, r.effect_id, r.id, r.outcome, r.author, r.evidence, r.attempt_id,
           r.created_at, (julianday('now') - 2440587.5) * 86400.0,
           'applied without a confirmed payment that moved money and a complete check for a second one'
    FROM resolution r WHERE r.id IN (SELECT id FROM verdicts_to_retract);

UPDATE reconcile_state SET non_final = 1, needs_attention = 0, last_outcome = 'applied',
        next_attempt_at = (julianday('now') - 2440587.5) * 86400.0, lease_owner = NULL, lease_until = NULL
    WHERE effect_id IN (SELECT effect_id FROM resolution
                        WHERE id IN (SELECT id FROM verdicts_to_retract));

DELETE FROM resolution WHERE id IN (SELECT id FROM verdicts_to_retract);
DROP TABLE verdicts_to_retract;
