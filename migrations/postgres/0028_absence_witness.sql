-- A verdict of absence must rest on a view that could have seen the payment. See the
-- SQLite file of the same name for what this does and why.

-- Row-level security applies to the migrating owner too: each tenant's rows are changed
-- inside that tenant's scope.
DO $$
DECLARE
    t BIGINT;
BEGIN
    FOR t IN SELECT id FROM tenant LOOP
        PERFORM set_config('reckon.tenant', t::text, true);
        CREATE TEMP TABLE absence_to_retract ON COMMIT DROP AS
            SELECT r.id, r.effect_id FROM resolution r
            WHERE r.tenant_id = t AND r.author = 'reconciler' AND r.outcome = 'not_applied'
              AND r.evidence::jsonb #>> '{classification,certificate,method}' LIKE 'stripe.%'
              AND COALESCE(r.evidence::jsonb #> '{classification,certificate,witness}',
                           'null'::jsonb) = 'null'::jsonb
              AND NOT EXISTS (SELECT 1 FROM writeback w WHERE w.resolution_id = r.id);
        INSERT INTO resolution_retracted (tenant_id, effect_id, resolution_id, outcome, author,
                evidence, attempt_id, resolved_at, retracted_at, reason)
            SELECT r.tenant_id, r.effect_id, r.id, r.outcome, r.author, r.evidence,
                   r.attempt_id, r.created_at, EXTRACT(EPOCH FROM clock_timestamp())::float8,
                   'not_applied from a window list with no witness that could have seen the '
                   'payment'
            FROM resolution r WHERE r.id IN (SELECT id FROM absence_to_retract);
        UPDATE reconcile_state SET non_final = TRUE, needs_attention = FALSE,
                last_outcome = 'not_applied',
                next_attempt_at = EXTRACT(EPOCH FROM clock_timestamp())::float8,
                lease_owner = NULL, lease_until = NULL
            WHERE tenant_id = t
              AND effect_id IN (SELECT effect_id FROM absence_to_retract);
        DELETE FROM resolution WHERE tenant_id = t
            AND id IN (SELECT id FROM absence_to_retract);
        DROP TABLE absence_to_retract;
    END LOOP;
    PERFORM set_config('reckon.tenant', '', true);
END
$$;
