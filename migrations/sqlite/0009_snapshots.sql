-- The dashboard's chart (issue 7): one row per tenant and hour with the number of unresolved
-- effects and the start of the oldest one, written by the serve scheduler
-- (reckon_engine::snapshot). The chart reads at most 31 days of it; taking a snapshot again
-- within the same hour replaces that hour's row.
CREATE TABLE unresolved_snapshot (
    tenant_id        INTEGER NOT NULL REFERENCES tenant(id),
    hour             REAL NOT NULL,
    unresolved       INTEGER NOT NULL,
    oldest_since     REAL,
    needs_attention  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, hour)
);

-- The unresolved queue (issue 7) is ordered by when each effect became unresolved: this
-- index holds exactly that order for the unresolved effects only (the predicate of 0005's
-- partial index, the expression of crates/reckon-ledger/src/dashboard.rs), so a page of 50
-- walks 50-odd index entries instead of sorting every unresolved effect of the tenant.
CREATE INDEX effect_unresolved_since ON effect (tenant_id,
    (CASE WHEN state = 'unknown' THEN updated_at ELSE COALESCE(expires_at, updated_at) END), id)
    WHERE (state = 'unknown' OR (state = 'in_progress' AND gone_at IS NULL));
