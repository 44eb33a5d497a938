-- The overview's provider health counted as lookups are recorded: lookups and indeterminate
-- outcomes per provider and ten minutes, so a day's health reads 144 buckets per provider
-- (times the slots) and at most ten minutes of attempts, whatever the number of lookups a
-- day. `slot` matters on PostgreSQL only (see its file of the same name); it is kept here
-- so both hold the same rows.
CREATE TABLE provider_lookups (
    tenant_id      INTEGER NOT NULL REFERENCES tenant(id),
    provider_id    INTEGER NOT NULL REFERENCES provider(id),
    bucket         REAL NOT NULL,
    slot           INTEGER NOT NULL,
    lookups        INTEGER NOT NULL,
    indeterminate  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, provider_id, bucket, slot)
);

-- Kept by the database itself, in the transaction that records the attempt. The bucket
-- expression is the one of crates/reckon-ledger/src/dashboard.rs (PROVIDER_HEALTH_SQL):
-- attempts' times are after 1970, so truncation is the floor.
CREATE TRIGGER reconcile_attempt_counted AFTER INSERT ON reconcile_attempt
WHEN NEW.provider_id IS NOT NULL
BEGIN
    INSERT INTO provider_lookups (tenant_id, provider_id, bucket, slot, lookups, indeterminate)
    VALUES (NEW.tenant_id, NEW.provider_id, CAST(NEW.finished_at / 600 AS INTEGER) * 600.0,
            NEW.id % 8, 1, CASE WHEN NEW.outcome = 'indeterminate' THEN 1 ELSE 0 END)
    ON CONFLICT (tenant_id, provider_id, bucket, slot) DO UPDATE
        SET lookups = lookups + 1, indeterminate = indeterminate + excluded.indeterminate;
END;

-- The attempts recorded before this migration.
INSERT INTO provider_lookups (tenant_id, provider_id, bucket, slot, lookups, indeterminate)
SELECT tenant_id, provider_id, CAST(finished_at / 600 AS INTEGER) * 600.0, 0, COUNT(*),
       SUM(CASE WHEN outcome = 'indeterminate' THEN 1 ELSE 0 END)
FROM reconcile_attempt WHERE provider_id IS NOT NULL
GROUP BY tenant_id, provider_id, CAST(finished_at / 600 AS INTEGER);
