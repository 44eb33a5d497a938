-- People, their roles per tenant, dashboard sessions, sign-in throttling, and who made each
-- API token; then row-level security on every table with a tenant_id. See the SQLite file of
-- the same name for what each column means.

CREATE TABLE app_user (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email            TEXT NOT NULL UNIQUE,
    password_hash    TEXT NOT NULL,
    totp_secret      BYTEA,
    auth_generation  BIGINT NOT NULL DEFAULT 0,
    disabled_at      DOUBLE PRECISION,
    created_at       DOUBLE PRECISION NOT NULL
);

CREATE TABLE membership (
    user_id     BIGINT NOT NULL REFERENCES app_user(id),
    tenant_id   BIGINT NOT NULL REFERENCES tenant(id),
    role        TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (user_id, tenant_id)
);
CREATE INDEX membership_tenant ON membership (tenant_id);

ALTER TABLE api_token ADD COLUMN created_by BIGINT REFERENCES app_user(id);
ALTER TABLE api_token ADD COLUMN creator_generation BIGINT;

CREATE TABLE web_session (
    id_hash          TEXT PRIMARY KEY,
    tenant_id        BIGINT NOT NULL REFERENCES tenant(id),
    user_id          BIGINT NOT NULL REFERENCES app_user(id),
    auth_generation  BIGINT NOT NULL,
    csrf_token       TEXT NOT NULL,
    created_at       DOUBLE PRECISION NOT NULL,
    last_seen_at     DOUBLE PRECISION NOT NULL,
    expires_at       DOUBLE PRECISION NOT NULL
);
CREATE INDEX web_session_user ON web_session (user_id);

CREATE TABLE auth_throttle (
    scope         TEXT NOT NULL,
    key           TEXT NOT NULL,
    failures      BIGINT NOT NULL,
    window_start  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (scope, key)
);

-- ---- Row-level security ----------------------------------------------------------------
--
-- The migrations run as the login user, which owns the tables. The application's pool
-- drops to the role reckon_app on every connection (SET ROLE, see postgres.rs): not the
-- owner, not a superuser, no BYPASSRLS, so the policies below apply to every query the
-- application makes, and FORCE makes them apply to the owner too. Each transaction names
-- its tenant with set_config('reckon.tenant', id, true), which ends with the transaction,
-- so a pooled connection never carries one tenant's context to the next borrower.
-- A query that forgot its tenant sees nothing and can write nothing.

-- Roles belong to the cluster, not the database: several databases (and concurrent test
-- runs) share it, so creating it tolerates a race.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'reckon_app') THEN
        BEGIN
            CREATE ROLE reckon_app NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
    -- The login user must be allowed to SET ROLE reckon_app (a superuser always may).
    IF NOT pg_has_role(current_user, 'reckon_app', 'MEMBER') THEN
        EXECUTE format('GRANT reckon_app TO %I', current_user);
    END IF;
END
$$;

GRANT USAGE ON SCHEMA public TO reckon_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO reckon_app;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO reckon_app;
-- Tables of later migrations get the same grants (but not RLS: each must add its own
-- policies, and the catalog test fails until it does).
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO reckon_app;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO reckon_app;
REVOKE ALL ON _sqlx_migrations FROM reckon_app;

-- The tenant of the current transaction, or NULL (matches no row) when none was set.
-- current_setting(..., true) returns '' once a local setting has ended in this session.
CREATE FUNCTION reckon_current_tenant() RETURNS BIGINT
    LANGUAGE sql STABLE
    AS $$ SELECT NULLIF(current_setting('reckon.tenant', true), '')::BIGINT $$;

-- Every table with a tenant_id gets the plain policy, except the three below that must also
-- be reachable before the tenant is known (by the token, session or user being checked).
-- This also covers tables earlier migrations of other features added.
DO $$
DECLARE
    t TEXT;
BEGIN
    FOR t IN
        SELECT c.relname
        FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
          AND c.relname NOT IN ('api_token', 'web_session', 'membership')
    LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format(
            'CREATE POLICY tenant_isolation ON %I '
            'USING (tenant_id = reckon_current_tenant()) '
            'WITH CHECK (tenant_id = reckon_current_tenant())', t);
    END LOOP;
END
$$;

-- A token is found by its hash before its tenant is known: the transaction that checks it
-- names the hash, and sees that one row.
ALTER TABLE api_token ENABLE ROW LEVEL SECURITY;
ALTER TABLE api_token FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON api_token
    USING (tenant_id = reckon_current_tenant()
           OR token_hash = NULLIF(current_setting('reckon.token', true), ''))
    WITH CHECK (tenant_id = reckon_current_tenant()
                OR token_hash = NULLIF(current_setting('reckon.token', true), ''));

-- Same for a session, by the hash of its id.
ALTER TABLE web_session ENABLE ROW LEVEL SECURITY;
ALTER TABLE web_session FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON web_session
    USING (tenant_id = reckon_current_tenant()
           OR id_hash = NULLIF(current_setting('reckon.session', true), ''))
    WITH CHECK (tenant_id = reckon_current_tenant());

-- A person signing in sees their own memberships (to pick a tenant), nobody else's.
ALTER TABLE membership ENABLE ROW LEVEL SECURITY;
ALTER TABLE membership FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON membership
    USING (tenant_id = reckon_current_tenant()
           OR user_id = NULLIF(current_setting('reckon.user', true), '')::BIGINT)
    WITH CHECK (tenant_id = reckon_current_tenant());
