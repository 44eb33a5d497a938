-- The overview's provider health counted as lookups are recorded: lookups and indeterminate
-- outcomes per provider and ten minutes, so a day's health reads 144 buckets per provider
-- (times the slots below) and at most ten minutes of attempts, whatever the number of
-- lookups a day. `slot` spreads one bucket over eight rows, so concurrent workers recording
-- attempts of one provider do not queue on one row's lock; readers sum the slots.
CREATE TABLE provider_lookups (
    tenant_id      BIGINT NOT NULL REFERENCES tenant(id),
    provider_id    BIGINT NOT NULL REFERENCES provider(id),
    bucket         DOUBLE PRECISION NOT NULL,
    slot           SMALLINT NOT NULL,
    lookups        BIGINT NOT NULL,
    indeterminate  BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, provider_id, bucket, slot)
);
ALTER TABLE provider_lookups ENABLE ROW LEVEL SECURITY;
ALTER TABLE provider_lookups FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON provider_lookups
    USING (tenant_id = reckon_current_tenant())
    WITH CHECK (tenant_id = reckon_current_tenant());

-- Kept by the database itself, in the transaction that records the attempt, so no path
-- that inserts an attempt can forget it. The bucket expression is the one of
-- crates/reckon-ledger/src/dashboard.rs (PROVIDER_HEALTH_SQL).
CREATE FUNCTION reckon_count_lookup() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.provider_id IS NOT NULL THEN
        INSERT INTO provider_lookups AS l
            (tenant_id, provider_id, bucket, slot, lookups, indeterminate)
        VALUES (NEW.tenant_id, NEW.provider_id, floor(NEW.finished_at / 600) * 600,
                NEW.id % 8, 1, CASE WHEN NEW.outcome = 'indeterminate' THEN 1 ELSE 0 END)
        ON CONFLICT (tenant_id, provider_id, bucket, slot) DO UPDATE
            SET lookups = l.lookups + 1, indeterminate = l.indeterminate + excluded.indeterminate;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER reconcile_attempt_counted AFTER INSERT ON reconcile_attempt
    FOR EACH ROW EXECUTE FUNCTION reckon_count_lookup();

-- The attempts recorded before this migration.
INSERT INTO provider_lookups (tenant_id, provider_id, bucket, slot, lookups, indeterminate)
SELECT tenant_id, provider_id, floor(finished_at / 600) * 600, 0, COUNT(*),
       SUM(CASE WHEN outcome = 'indeterminate' THEN 1 ELSE 0 END)
FROM reconcile_attempt WHERE provider_id IS NOT NULL
GROUP BY tenant_id, provider_id, floor(finished_at / 600) * 600;

-- The overview's counts by kind and the scrape both skip resolved effects by their id:
-- with the id in the covering index of 0005 they read the index alone, never one heap
-- page per unresolved effect.
DROP INDEX effect_metrics_unresolved;
CREATE INDEX effect_metrics_unresolved ON effect (tenant_id, source_id, operation)
    INCLUDE (state, updated_at, expires_at, abandoned_at, created_at, id)
    WHERE (state = 'unknown' OR (state = 'in_progress' AND gone_at IS NULL));
