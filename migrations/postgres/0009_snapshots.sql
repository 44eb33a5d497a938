-- The dashboard's chart (issue 7): one row per tenant and hour with the number of unresolved
-- effects and the start of the oldest one. See the SQLite file of the same name.
CREATE TABLE unresolved_snapshot (
    tenant_id        BIGINT NOT NULL REFERENCES tenant(id),
    hour             DOUBLE PRECISION NOT NULL,
    unresolved       BIGINT NOT NULL,
    oldest_since     DOUBLE PRECISION,
    needs_attention  BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, hour)
);

-- Tenant data: row-level security like every table of migration 0004 (grants come from the
-- default privileges 0004 set).
ALTER TABLE unresolved_snapshot ENABLE ROW LEVEL SECURITY;
ALTER TABLE unresolved_snapshot FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON unresolved_snapshot
    USING (tenant_id = reckon_current_tenant())
    WITH CHECK (tenant_id = reckon_current_tenant());

-- The unresolved queue (issue 7) is ordered by when each effect became unresolved: this
-- index holds exactly that order for the unresolved effects only (the predicate of 0005's
-- partial index, the expression of crates/reckon-ledger/src/dashboard.rs), so a page of 50
-- walks 50-odd index entries instead of sorting every unresolved effect of the tenant.
CREATE INDEX effect_unresolved_since ON effect (tenant_id,
    (CASE WHEN state = 'unknown' THEN updated_at ELSE COALESCE(expires_at, updated_at) END), id)
    WHERE (state = 'unknown' OR (state = 'in_progress' AND gone_at IS NULL));
