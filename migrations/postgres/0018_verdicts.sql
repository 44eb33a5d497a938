-- Verdicts are decided on money, over payments read as they are now. See the SQLite file
-- of the same name for what this does and why.
CREATE TABLE resolution_retracted (
    id             BIGSERIAL PRIMARY KEY,
    tenant_id      BIGINT NOT NULL REFERENCES tenant(id),
    effect_id      BIGINT NOT NULL,
    resolution_id  BIGINT NOT NULL,
    outcome        TEXT NOT NULL,
    author         TEXT NOT NULL,
    evidence       TEXT NOT NULL,
    attempt_id     BIGINT,
    resolved_at    DOUBLE PRECISION NOT NULL,
    retracted_at   DOUBLE PRECISION NOT NULL,
    reason         TEXT NOT NULL
);
CREATE INDEX resolution_retracted_effect ON resolution_retracted (tenant_id, effect_id);

ALTER TABLE resolution_retracted ENABLE ROW LEVEL SECURITY;
ALTER TABLE resolution_retracted FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON resolution_retracted
    USING (tenant_id = reckon_current_tenant())
    WITH CHECK (tenant_id = reckon_current_tenant());

-- Row-level security applies to the migrating owner too: each tenant's rows are changed
-- inside that tenant's scope.
DO $$
DECLARE
    t BIGINT;
BEGIN
    FOR t IN SELECT id FROM tenant LOOP
        PERFORM set_config('reckon.tenant', t::text, true);
        CREATE TEMP TABLE verdicts_to_retract ON COMMIT DROP AS
            SELECT r.id, r.effect_id FROM resolution r
            WHERE r.tenant_id = t AND r.author = 'reconciler' AND r.outcome = 'applied'
              AND COALESCE(r.evidence::jsonb #> '{classification,certificate}', 'null'::jsonb)
                  = 'null'::jsonb
              AND NOT EXISTS (SELECT 1 FROM writeback w WHERE w.resolution_id = r.id);
        INSERT INTO resolution_retracted (tenant_id, effect_id, resolution_id, outcome, author,
                evidence, attempt_id, resolved_at, retracted_at, reason)
            SELECT r.tenant_id, r.effect_id, r.id, r.outcome, r.author, r.evidence,
                   r.attempt_id, r.created_at, EXTRACT(EPOCH FROM clock_timestamp())::float8,
                   'applied without a confirmed payment that moved money and a complete '
                   'check for a second one'
            FROM resolution r WHERE r.id IN (SELECT id FROM verdicts_to_retract);
        UPDATE reconcile_state SET non_final = TRUE, needs_attention = FALSE,
                last_outcome = 'applied',
                next_attempt_at = EXTRACT(EPOCH FROM clock_timestamp())::float8,
                lease_owner = NULL, lease_until = NULL
            WHERE effect_id IN (SELECT effect_id FROM verdicts_to_retract);
        DELETE FROM resolution WHERE id IN (SELECT id FROM verdicts_to_retract);
        DROP TABLE verdicts_to_retract;
    END LOOP;
    PERFORM set_config('reckon.tenant', '', true);
END
$$;
