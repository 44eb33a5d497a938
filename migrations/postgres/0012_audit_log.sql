-- An append-only record of what people did (sign-in, failed sign-in, source, provider and
-- route changes, manual resolutions, exports, token creation and revocation), for the
-- tenant's admins. The application role may add and read rows, never change or remove
-- them.
CREATE TABLE audit_log (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id  BIGINT NOT NULL REFERENCES tenant(id),
    at         DOUBLE PRECISION NOT NULL,
    actor      TEXT NOT NULL,
    action     TEXT NOT NULL,
    target     TEXT,
    detail     TEXT NOT NULL DEFAULT '{}',
    address    TEXT
);
CREATE INDEX audit_log_tenant ON audit_log (tenant_id, id);
ALTER TABLE audit_log ENABLE ROW LEVEL SECURITY;
ALTER TABLE audit_log FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON audit_log
    USING (tenant_id = reckon_current_tenant())
    WITH CHECK (tenant_id = reckon_current_tenant());
REVOKE UPDATE, DELETE, TRUNCATE ON audit_log FROM reckon_app;
