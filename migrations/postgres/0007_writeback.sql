-- Write-back (issue 4 item 7). PostgreSQL dialect; see the SQLite file of the same name for
-- what each column means.

ALTER TABLE source ADD COLUMN writeback TEXT;

CREATE TABLE writeback (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id        BIGINT NOT NULL REFERENCES tenant(id),
    source_id        BIGINT NOT NULL REFERENCES source(id),
    effect_id        BIGINT NOT NULL REFERENCES effect(id),
    resolution_id    BIGINT NOT NULL UNIQUE REFERENCES resolution(id),
    key              TEXT NOT NULL,
    action           TEXT NOT NULL,
    seen_state       TEXT NOT NULL,
    seen_updated_at  DOUBLE PRECISION NOT NULL,
    new_response     TEXT,
    new_updated_at   DOUBLE PRECISION NOT NULL,
    status           TEXT NOT NULL,
    detail           TEXT,
    recovered        BOOLEAN NOT NULL DEFAULT FALSE,
    created_at       DOUBLE PRECISION NOT NULL,
    settled_at       DOUBLE PRECISION
);
CREATE INDEX writeback_status ON writeback (tenant_id, status, id);
CREATE INDEX writeback_effect ON writeback (effect_id);

-- Row-level security like migration 0004's: the grants come by default privileges, the
-- policy must be added here (the rls test fails for a tenant table without one).
ALTER TABLE writeback ENABLE ROW LEVEL SECURITY;
ALTER TABLE writeback FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON writeback
    USING (tenant_id = reckon_current_tenant())
    WITH CHECK (tenant_id = reckon_current_tenant());
