-- A verdict of absence must rest on a view that could have seen the payment: a window list
-- comes back whole and empty when the application's clock is off, its key lives on an
-- object the lists do not read, or under another metadata field. Ledgers whose reconciler
-- concluded `not_applied` from a provider's window lists alone (a `stripe.` certificate
-- without a `witness`) lose those verdicts here, as 0018 did for `applied`: each is kept in
-- resolution_retracted, taken off the effect, and the effect is due for a lookup at once,
-- shown as "not found so far" until it gets one. A lookup by key (the http protocol, the
-- demo) was its own witness and stays. Verdicts already written back stay: the application
-- has acted on them (their write-back log says so) and a person must look.
CREATE TEMP TABLE absence_to_retract AS
    SELECT r.id FROM resolution r
    WHERE r.author = 'reconciler' AND r.outcome = 'not_applied'
      AND json_extract(r.evidence, '$.classification.certificate.method') LIKE 'stripe.%'
      AND json_extract(r.evidence, '$.classification.certificate.witness') IS NULL
      AND NOT EXISTS (SELECT 1 FROM writeback w WHERE w.resolution_id = r.id);

INSERT INTO resolution_retracted (tenant_id, effect_id, resolution_id, outcome, author,
        evidence, attempt_id, resolved_at, retracted_at, reason)
    SELECT r.tenant_id, r.effect_id, r.id, r.outcome, r.author, r.evidence, r.attempt_id,
           r.created_at, (julianday('now') - 2440587.5) * 86400.0,
           'not_applied from a window list with no witness that could have seen the payment'
    FROM resolution r WHERE r.id IN (SELECT id FROM absence_to_retract);

UPDATE reconcile_state SET non_final = 1, needs_attention = 0, last_outcome = 'not_applied',
        next_attempt_at = (julianday('now') - 2440587.5) * 86400.0, lease_owner = NULL, lease_until = NULL
    WHERE effect_id IN (SELECT effect_id FROM resolution
                        WHERE id IN (SELECT id FROM absence_to_retract));

DELETE FROM resolution WHERE id IN (SELECT id FROM absence_to_retract);
DROP TABLE absence_to_retract;
