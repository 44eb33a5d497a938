-- reckon's ledger, SQLite dialect. Times are Unix epoch seconds (REAL), the representation
-- justonce itself writes, so a source's timestamps round-trip exactly (see ARCHITECTURE.md).
-- The PostgreSQL file of the same name holds the same tables in its own types.

CREATE TABLE tenant (
    id          INTEGER PRIMARY KEY,
    slug        TEXT NOT NULL UNIQUE,
    created_at  REAL NOT NULL
);

-- Only a SHA-256 of each token is stored: tokens are 256-bit random strings, so a fast
-- hash is enough, and a database dump yields no usable token.
CREATE TABLE api_token (
    id           INTEGER PRIMARY KEY,
    tenant_id    INTEGER NOT NULL REFERENCES tenant(id),
    role         TEXT NOT NULL,
    token_hash   TEXT NOT NULL UNIQUE,
    label        TEXT NOT NULL,
    created_at   REAL NOT NULL,
    last_used_at REAL,
    revoked_at   REAL
);

-- A scanned or push source. The DSN is stored only encrypted (dsn_ciphertext, bound to
-- tenant and source name); dsn_display is the redacted form shown to people.
CREATE TABLE source (
    id                    INTEGER PRIMARY KEY,
    tenant_id             INTEGER NOT NULL REFERENCES tenant(id),
    name                  TEXT NOT NULL,
    kind                  TEXT NOT NULL,
    dsn_ciphertext        BLOB,
    dsn_display           TEXT,
    table_name            TEXT NOT NULL,
    scan_interval_secs    INTEGER NOT NULL,
    abandoned_after_secs  REAL NOT NULL,
    overlap_secs          REAL NOT NULL,
    full_scan_every_secs  INTEGER NOT NULL,
    -- (updated_at, key) of the last row stored or quarantined; moved only in the
    -- transaction that stored the rows it passed.
    cursor_updated_at     REAL,
    cursor_key            BLOB,
    last_scan_at          REAL,
    last_success_at       REAL,
    last_full_scan_at     REAL,
    last_error            TEXT,
    last_error_at         REAL,
    consecutive_failures  INTEGER NOT NULL DEFAULT 0,
    created_at            REAL NOT NULL,
    UNIQUE (tenant_id, name)
);

CREATE TABLE effect (
    id               INTEGER PRIMARY KEY,
    tenant_id        INTEGER NOT NULL REFERENCES tenant(id),
    source_id        INTEGER NOT NULL REFERENCES source(id),
    key              TEXT NOT NULL,
    -- parsed from operation:version:part[:part...] when the key has that shape
    operation        TEXT,
    key_version      TEXT,
    subject          TEXT,
    state            TEXT NOT NULL,
    request_hash     TEXT NOT NULL,
    response         TEXT,
    attempts         INTEGER NOT NULL,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    expires_at       REAL,
    -- expires_at + the source's grace period, for in_progress rows: the moment the claim
    -- counts as abandoned. Stored so "unresolved" is an indexed predicate.
    abandoned_at     REAL,
    first_seen_at    REAL NOT NULL,
    last_changed_at  REAL NOT NULL,
    -- set when the row was noticed missing from its source; reckon keeps the effect
    gone_at          REAL,
    gone_reason      TEXT,
    UNIQUE (tenant_id, source_id, key)
);
CREATE INDEX effect_subject ON effect (tenant_id, subject);
CREATE INDEX effect_unresolved ON effect (tenant_id, state, abandoned_at)
    WHERE state IN ('unknown', 'in_progress');

-- Extra lookup parts for subjects made of several parts (cus_9:ORD-17): single-part
-- subjects are found through effect_subject, so most effects add no row here.
CREATE TABLE effect_key_part (
    effect_id  INTEGER NOT NULL REFERENCES effect(id),
    tenant_id  INTEGER NOT NULL REFERENCES tenant(id),
    part       TEXT NOT NULL,
    PRIMARY KEY (effect_id, part)
);
CREATE INDEX effect_key_part_lookup ON effect_key_part (tenant_id, part);

-- Append-only: one row per observed change (first sight, a state change, a disappearance).
CREATE TABLE effect_event (
    id                INTEGER PRIMARY KEY,
    tenant_id         INTEGER NOT NULL REFERENCES tenant(id),
    effect_id         INTEGER NOT NULL REFERENCES effect(id),
    observed_at       REAL NOT NULL,
    origin            TEXT NOT NULL,
    kind              TEXT NOT NULL,
    from_state        TEXT,
    to_state          TEXT,
    attempts          INTEGER,
    source_updated_at REAL,
    detail            TEXT
);
CREATE INDEX effect_event_effect ON effect_event (effect_id, id);

-- Rows that could not be stored as effects. fingerprint is a hash of the whole raw row,
-- so re-reading the same hostile row writes nothing.
CREATE TABLE quarantine (
    id            INTEGER PRIMARY KEY,
    tenant_id     INTEGER NOT NULL REFERENCES tenant(id),
    source_id     INTEGER NOT NULL REFERENCES source(id),
    reason        TEXT NOT NULL,
    detail        TEXT NOT NULL,
    key_excerpt   TEXT NOT NULL,
    key_bytes     BLOB,
    excerpt       TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,
    origin        TEXT NOT NULL,
    first_seen_at REAL NOT NULL,
    UNIQUE (source_id, fingerprint)
);
CREATE INDEX quarantine_source ON quarantine (tenant_id, source_id, reason);
