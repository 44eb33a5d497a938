-- People, their roles per tenant, dashboard sessions, sign-in throttling, and who made each
-- API token. The PostgreSQL file of the same name holds the same tables plus row-level
-- security; SQLite has none, so there the tenant-scoped types are the only control.

-- A person who signs in to the dashboard. Users are not tenant data: one person may belong
-- to several tenants through membership. email is stored lower-cased.
CREATE TABLE app_user (
    id               INTEGER PRIMARY KEY,
    email            TEXT NOT NULL UNIQUE,
    -- argon2id PHC string; never the password
    password_hash    TEXT NOT NULL,
    -- TOTP secret, sealed with the master key and bound to the user id; NULL = no second factor
    totp_secret      BLOB,
    -- bumped when the password changes or the user is disabled: every session and token
    -- made under an older generation stops working, on every replica, at its next request
    auth_generation  INTEGER NOT NULL DEFAULT 0,
    disabled_at      REAL,
    created_at       REAL NOT NULL
);

CREATE TABLE membership (
    user_id     INTEGER NOT NULL REFERENCES app_user(id),
    tenant_id   INTEGER NOT NULL REFERENCES tenant(id),
    role        TEXT NOT NULL,
    created_at  REAL NOT NULL,
    PRIMARY KEY (user_id, tenant_id)
);
CREATE INDEX membership_tenant ON membership (tenant_id);

-- NULL created_by = made by the operator (CLI). A token made by a person acts with at most
-- that person's current role in the tenant, and dies with their generation.
ALTER TABLE api_token ADD COLUMN created_by INTEGER REFERENCES app_user(id);
ALTER TABLE api_token ADD COLUMN creator_generation INTEGER;

-- Dashboard sessions. Only SHA-256 of the session id is stored, so a read of this table
-- does not yield a usable cookie.
CREATE TABLE web_session (
    id_hash          TEXT PRIMARY KEY,
    tenant_id        INTEGER NOT NULL REFERENCES tenant(id),
    user_id          INTEGER NOT NULL REFERENCES app_user(id),
    auth_generation  INTEGER NOT NULL,
    csrf_token       TEXT NOT NULL,
    created_at       REAL NOT NULL,
    last_seen_at     REAL NOT NULL,
    expires_at       REAL NOT NULL
);
CREATE INDEX web_session_user ON web_session (user_id);

-- Failed sign-ins per account and per client address, in the database so that the limit
-- holds across replicas.
CREATE TABLE auth_throttle (
    scope         TEXT NOT NULL,
    key           TEXT NOT NULL,
    failures      INTEGER NOT NULL,
    window_start  REAL NOT NULL,
    PRIMARY KEY (scope, key)
);
