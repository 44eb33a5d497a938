-- The double-charge audit (issue 6): the tenant's day (time zone, nightly run time), the
-- provider's charges as imported for a day, and the audit runs, chained by digest.
-- PostgreSQL dialect; the SQLite file of the same name holds the same tables.

-- The tenant's calendar: days are cut in its zone (IANA name), and the nightly audit of
-- yesterday runs at audit_time (HH:MM, local).
ALTER TABLE tenant ADD COLUMN time_zone TEXT NOT NULL DEFAULT 'UTC';
ALTER TABLE tenant ADD COLUMN audit_time TEXT NOT NULL DEFAULT '06:00';

-- The effects of a day are read by creation time, so an audit costs O(effects of the day),
-- not O(ledger).
CREATE INDEX effect_created ON effect (tenant_id, created_at);

-- One money-moving object at a provider, as last imported (a re-import of the same day
-- replaces the row: refunds and captures change after creation). Amounts in minor units;
-- refunds and metadata are JSON; raw is the provider's object as it was read (evidence).
CREATE TABLE provider_charge (
    tenant_id        BIGINT NOT NULL REFERENCES tenant(id),
    provider_id      BIGINT NOT NULL REFERENCES provider(id),
    charge_id        TEXT NOT NULL,
    payment_intent   TEXT,
    amount           BIGINT NOT NULL,
    currency         TEXT NOT NULL,
    status           TEXT NOT NULL,
    amount_captured  BIGINT NOT NULL,
    amount_refunded  BIGINT NOT NULL,
    refunds          TEXT NOT NULL,
    metadata         TEXT NOT NULL,
    idempotency_key  TEXT,
    customer         TEXT,
    created          DOUBLE PRECISION NOT NULL,
    raw              TEXT NOT NULL,
    imported_at      DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant_id, provider_id, charge_id)
);
CREATE INDEX provider_charge_created ON provider_charge (tenant_id, created);

-- An audit run of one day, complete or failed (with its reason, and no findings). Runs of a
-- tenant form a chain: seq grows by one, and digest = SHA-256 over the canonical encoding of
-- the run and the previous run's digest, so an edited or removed run is detectable.
-- UNIQUE (tenant_id, seq) makes two concurrent appends conflict instead of forking the chain.
CREATE TABLE audit_run (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id     BIGINT NOT NULL REFERENCES tenant(id),
    seq           BIGINT NOT NULL,
    day           TEXT NOT NULL,
    time_zone     TEXT NOT NULL,
    window_start  DOUBLE PRECISION NOT NULL,
    window_end    DOUBLE PRECISION NOT NULL,
    -- a provider name, or '*' for all of the tenant's providers
    provider      TEXT NOT NULL,
    -- a person's email, 'operator' (CLI), or 'schedule'
    triggered_by  TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('complete', 'failed')),
    reason        TEXT,
    started_at    DOUBLE PRECISION NOT NULL,
    finished_at   DOUBLE PRECISION NOT NULL,
    counts        TEXT NOT NULL,
    findings      TEXT NOT NULL,
    totals        TEXT NOT NULL,
    evidence      TEXT NOT NULL,
    prev_digest   TEXT NOT NULL,
    digest        TEXT NOT NULL,
    UNIQUE (tenant_id, seq)
);
CREATE INDEX audit_run_day ON audit_run (tenant_id, day);
-- The nightly run is stored once per day and provider scope, whichever replica ran it.
CREATE UNIQUE INDEX audit_run_scheduled_once ON audit_run (tenant_id, day, provider)
    WHERE triggered_by = 'schedule' AND status = 'complete';

ALTER TABLE provider_charge ENABLE ROW LEVEL SECURITY;
ALTER TABLE provider_charge FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON provider_charge
    USING (tenant_id = reckon_current_tenant())
    WITH CHECK (tenant_id = reckon_current_tenant());
ALTER TABLE audit_run ENABLE ROW LEVEL SECURITY;
ALTER TABLE audit_run FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON audit_run
    USING (tenant_id = reckon_current_tenant())
    WITH CHECK (tenant_id = reckon_current_tenant());
