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
