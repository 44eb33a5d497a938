-- An append-only record of what people did (sign-in, failed sign-in, source, provider and
-- route changes, manual resolutions, exports, token creation and revocation), for the
-- tenant's admins. Append-only by triggers (SQLite has no roles).
CREATE TABLE audit_log (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id  INTEGER NOT NULL REFERENCES tenant(id),
    at         REAL NOT NULL,
    actor      TEXT NOT NULL,
    action     TEXT NOT NULL,
    target     TEXT,
    detail     TEXT NOT NULL DEFAULT '{}',
    address    TEXT
);
CREATE INDEX audit_log_tenant ON audit_log (tenant_id, id);
CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END;
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END;
