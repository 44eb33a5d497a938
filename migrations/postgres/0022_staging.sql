-- New effects are staged in a temporary table that reckon_app creates in each pooled
-- connection (crates/reckon-ledger/src/postgres.rs, STAGE_TABLE). PUBLIC holds TEMPORARY
-- on a new database; where an operator revoked it, grant it to reckon_app alone. A login
-- that may not grant it leaves the privilege as it was: the pool's first connection then
-- fails with PostgreSQL's own "permission denied to create temporary tables".
DO $$
BEGIN
    EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO reckon_app', current_database());
EXCEPTION WHEN insufficient_privilege THEN
    NULL;
END $$;
