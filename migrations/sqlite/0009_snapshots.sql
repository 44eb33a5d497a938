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
