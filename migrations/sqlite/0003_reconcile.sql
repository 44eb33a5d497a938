-- Reconciliation: providers, routes, per-effect reconcile state, attempts and resolutions.
-- SQLite dialect; the PostgreSQL file of the same name holds the same tables.

-- A provider account of a tenant. The secret (API key, auth header) is stored only sealed,
-- bound to tenant and provider name; settings is JSON without secrets (base_url, account,
-- mode, metadata_field, key_template, visibility_lag_secs, rate_per_sec, ...).
CREATE TABLE provider (
    id                 INTEGER PRIMARY KEY,
    tenant_id          INTEGER NOT NULL REFERENCES tenant(id),
    name               TEXT NOT NULL,
    kind               TEXT NOT NULL,
    secret_ciphertext  BLOB,
    settings           TEXT NOT NULL,
    created_at         REAL NOT NULL,
    UNIQUE (tenant_id, name)
);

-- Which provider answers for an operation of a source. provider_id NULL means "none": the
-- effect stays unresolved and says so. operation '*' matches every operation.
CREATE TABLE provider_route (
    id           INTEGER PRIMARY KEY,
    tenant_id    INTEGER NOT NULL REFERENCES tenant(id),
    source_id    INTEGER NOT NULL REFERENCES source(id),
    operation    TEXT NOT NULL,
    provider_id  INTEGER REFERENCES provider(id),
    created_at   REAL NOT NULL,
    UNIQUE (tenant_id, source_id, operation)
);

-- One row per effect the reconciler has touched: its lease, schedule and last outcome.
-- The lease (owner, until) is taken by a conditional update, so two workers never hold
-- one effect; an expired lease (crashed worker) is free again.
CREATE TABLE reconcile_state (
    effect_id        INTEGER PRIMARY KEY REFERENCES effect(id),
    tenant_id        INTEGER NOT NULL REFERENCES tenant(id),
    lease_owner      TEXT,
    lease_until      REAL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  REAL NOT NULL,
    last_attempt_at  REAL,
    last_outcome     TEXT,
    last_error       TEXT,
    provider_id      INTEGER REFERENCES provider(id),
    non_final        BOOLEAN NOT NULL DEFAULT FALSE,
    needs_attention  BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX reconcile_state_due ON reconcile_state (tenant_id, next_attempt_at);

-- Append-only: every lookup, with the evidence it produced (JSON).
CREATE TABLE reconcile_attempt (
    id           INTEGER PRIMARY KEY,
    tenant_id    INTEGER NOT NULL REFERENCES tenant(id),
    effect_id    INTEGER NOT NULL REFERENCES effect(id),
    provider_id  INTEGER REFERENCES provider(id),
    started_at   REAL NOT NULL,
    finished_at  REAL NOT NULL,
    outcome      TEXT NOT NULL,
    method       TEXT,
    error        TEXT,
    evidence     TEXT NOT NULL
);
CREATE INDEX reconcile_attempt_effect ON reconcile_attempt (effect_id, id);
CREATE INDEX reconcile_attempt_provider ON reconcile_attempt (tenant_id, provider_id, outcome);

-- A conclusion: at most one per effect (UNIQUE), so a crash and retry can never record two.
-- author is 'reconciler' or a person; a person's resolution needs a note and freezes the
-- evidence seen at that moment.
CREATE TABLE resolution (
    id           INTEGER PRIMARY KEY,
    tenant_id    INTEGER NOT NULL REFERENCES tenant(id),
    effect_id    INTEGER NOT NULL UNIQUE REFERENCES effect(id),
    outcome      TEXT NOT NULL,
    author       TEXT NOT NULL,
    note         TEXT,
    evidence     TEXT NOT NULL,
    attempt_id   INTEGER REFERENCES reconcile_attempt(id),
    created_at   REAL NOT NULL
);
