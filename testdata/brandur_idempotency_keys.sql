-- The idempotency table of Brandur Leach's "Implementing Stripe-like Idempotency Keys in
-- Postgres" as its public example application keeps it: table `idempotency_keys` of
-- github.com/brandur/rocket-rides-atomic (schema.sql), the columns, types and checks
-- reckon's `brandur` mapping reads, restated for reckon's tests. The other tables of that
-- schema (users, rides, audit_records, staged_jobs) are left out: the mapping reads only
-- this one, and the foreign key to users with them.
CREATE TABLE idempotency_keys (
    id              BIGSERIAL   PRIMARY KEY,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    idempotency_key TEXT        NOT NULL CHECK (char_length(idempotency_key) <= 100),
    last_run_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    locked_at       TIMESTAMPTZ DEFAULT now(),
    request_method  TEXT        NOT NULL CHECK (char_length(request_method) <= 10),
    request_params  JSONB       NOT NULL,
    request_path    TEXT        NOT NULL CHECK (char_length(request_path) <= 100),
    response_code   INT         NULL,
    response_body   JSONB       NULL,
    recovery_point  TEXT        NOT NULL CHECK (char_length(recovery_point) <= 50),
    user_id         BIGINT      NOT NULL
);

CREATE UNIQUE INDEX idempotency_keys_user_id_idempotency_key
    ON idempotency_keys (user_id, idempotency_key);
