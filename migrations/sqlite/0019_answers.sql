-- Support finds a provider charge by what names it besides its own id: the order id inside
-- its idempotency key or metadata, its PaymentIntent, a refund's id. Each of those terms is
-- a row here, written when the charge is imported, so a lookup is a probe of this primary
-- key, never a scan of the tenant's charges.
CREATE TABLE provider_charge_term (
    tenant_id    INTEGER NOT NULL,
    term         TEXT NOT NULL,
    provider_id  INTEGER NOT NULL,
    charge_id    TEXT NOT NULL,
    PRIMARY KEY (tenant_id, term, provider_id, charge_id)
) WITHOUT ROWID;
CREATE INDEX provider_charge_term_charge ON provider_charge_term (tenant_id, provider_id, charge_id);

-- Work the Rust side of `migrate` still owes the data already stored (the terms of charges
-- imported before this table existed are computed by the same code that writes new ones).
CREATE TABLE pending_backfill (name TEXT PRIMARY KEY);
INSERT INTO pending_backfill (name) VALUES ('charge_terms');

-- An audit run may be `partial`: some providers' parts of the day failed (each with its
-- reason in the run's evidence), the others' findings stand. SQLite cannot change a CHECK
-- constraint, so the table is rebuilt with the same columns and rows.
CREATE TABLE audit_run_v2 (
    id            INTEGER PRIMARY KEY,
    tenant_id     INTEGER NOT NULL REFERENCES tenant(id),
    seq           INTEGER NOT NULL,
    day           TEXT NOT NULL,
    time_zone     TEXT NOT NULL,
    window_start  REAL NOT NULL,
    window_end    REAL NOT NULL,
    -- a provider name, or '*' for all of the tenant's providers
    provider      TEXT NOT NULL,
    -- a person's email, 'operator' (CLI), or 'schedule'
    triggered_by  TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('complete', 'partial', 'failed')),
    reason        TEXT,
    started_at    REAL NOT NULL,
    finished_at   REAL NOT NULL,
    counts        TEXT NOT NULL,
    findings      TEXT NOT NULL,
    totals        TEXT NOT NULL,
    evidence      TEXT NOT NULL,
    prev_digest   TEXT NOT NULL,
    digest        TEXT NOT NULL,
    UNIQUE (tenant_id, seq)
);
INSERT INTO audit_run_v2 (id, tenant_id, seq, day, time_zone, window_start, window_end, provider,
        triggered_by, status, reason, started_at, finished_at, counts, findings, totals, evidence,
        prev_digest, digest)
    SELECT id, tenant_id, seq, day, time_zone, window_start, window_end, provider, triggered_by,
        status, reason, started_at, finished_at, counts, findings, totals, evidence, prev_digest,
        digest
    FROM audit_run;
DROP TABLE audit_run;
ALTER TABLE audit_run_v2 RENAME TO audit_run;
CREATE INDEX audit_run_day ON audit_run (tenant_id, day);
-- The nightly run is stored once per day and provider scope, whichever replica ran it.
CREATE UNIQUE INDEX audit_run_scheduled_once ON audit_run (tenant_id, day, provider)
    WHERE triggered_by = 'schedule' AND status = 'complete';
