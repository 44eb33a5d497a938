-- Support finds a provider charge by what names it besides its own id. See the SQLite file
-- of the same name.
CREATE TABLE provider_charge_term (
    tenant_id    BIGINT NOT NULL REFERENCES tenant(id),
    term         TEXT NOT NULL,
    provider_id  BIGINT NOT NULL,
    charge_id    TEXT NOT NULL,
    PRIMARY KEY (tenant_id, term, provider_id, charge_id)
);
CREATE INDEX provider_charge_term_charge ON provider_charge_term (tenant_id, provider_id, charge_id);

ALTER TABLE provider_charge_term ENABLE ROW LEVEL SECURITY;
ALTER TABLE provider_charge_term FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON provider_charge_term
    USING (tenant_id = reckon_current_tenant())
    WITH CHECK (tenant_id = reckon_current_tenant());

-- Work the Rust side of `migrate` still owes the data already stored (no tenant's rows:
-- names of one-off jobs).
CREATE TABLE pending_backfill (name TEXT PRIMARY KEY);
INSERT INTO pending_backfill (name) VALUES ('charge_terms');

-- An audit run may be `partial`: some providers' parts of the day failed (each with its
-- reason in the run's evidence), the others' findings stand.
ALTER TABLE audit_run DROP CONSTRAINT audit_run_status_check;
ALTER TABLE audit_run ADD CONSTRAINT audit_run_status_check
    CHECK (status IN ('complete', 'partial', 'failed'));
