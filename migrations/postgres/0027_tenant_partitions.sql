-- `effect` and `provider_charge` partitioned by hash of `tenant_id`, 16 partitions each.
-- In one heap, a tenant's rows share their pages with every other tenant's: a day's audit
-- (its effects and charges read by `created`) or a rescan's changed rows touch pages in
-- proportion to the whole ledger, most of them other tenants' rows. In a partition they
-- share pages with a sixteenth of the fleet. Every statement names its tenant, in its
-- WHERE clause or through row-level security (`reckon_current_tenant()` is stable, so
-- PostgreSQL prunes to one partition when the statement starts), so each reads one
-- partition's indexes and pages. Time partitioning, which a tenant's own interleaved days
-- would need, is a different shape (ARCHITECTURE.md, "Scale").
--
-- PostgreSQL's unique indexes on a partitioned table must hold the partition key: the
-- effect's primary key becomes (id, tenant_id) (ids stay unique: one identity for the
-- table), and the tables that name an effect name it with its tenant, so a row can no
-- longer point at another tenant's effect. The key's uniqueness, (tenant_id, source_id,
-- key), already held it.
--
-- The tables are rebuilt: renamed, their rows copied into the new ones, dropped. The copy
-- costs about what a first load of the same rows costs; it runs once, in this migration's
-- transaction.

ALTER TABLE effect RENAME TO effect_unpartitioned;
ALTER SEQUENCE effect_id_seq RENAME TO effect_unpartitioned_id_seq;
ALTER TABLE provider_charge RENAME TO provider_charge_unpartitioned;

CREATE TABLE effect (
    id               BIGINT GENERATED ALWAYS AS IDENTITY,
    tenant_id        BIGINT NOT NULL,
    source_id        BIGINT NOT NULL,
    key              TEXT NOT NULL,
    operation        TEXT,
    key_version      TEXT,
    subject          TEXT,
    state            TEXT NOT NULL,
    request_hash     TEXT NOT NULL,
    response         TEXT,
    attempts         BIGINT NOT NULL,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL,
    expires_at       DOUBLE PRECISION,
    abandoned_at     DOUBLE PRECISION,
    first_seen_at    DOUBLE PRECISION NOT NULL,
    last_changed_at  DOUBLE PRECISION NOT NULL,
    gone_at          DOUBLE PRECISION,
    gone_reason      TEXT,
    resolved         BOOLEAN NOT NULL DEFAULT FALSE,
    first_event_id   BIGINT,
    first_origin     TEXT,
    first_state      TEXT,
    first_attempts   BIGINT,
    first_updated_at DOUBLE PRECISION,
    parked           BOOLEAN NOT NULL DEFAULT FALSE
) PARTITION BY HASH (tenant_id);

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
    imported_at      DOUBLE PRECISION NOT NULL
) PARTITION BY HASH (tenant_id);

-- Each partition carries the parent's policy as well: a statement that named a partition
-- directly would otherwise read it without the parent's.
DO $$
DECLARE
    t TEXT;
    part TEXT;
BEGIN
    FOREACH t IN ARRAY ARRAY['effect', 'provider_charge'] LOOP
        FOR i IN 0..15 LOOP
            part := format('%s_%s', t, lpad(i::text, 2, '0'));
            EXECUTE format(
                'CREATE TABLE %I PARTITION OF %I FOR VALUES WITH (MODULUS 16, REMAINDER %s)',
                part, t, i);
            EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', part);
            EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', part);
            EXECUTE format(
                'CREATE POLICY tenant_isolation ON %I '
                'USING (tenant_id = reckon_current_tenant()) '
                'WITH CHECK (tenant_id = reckon_current_tenant())', part);
        END LOOP;
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format(
            'CREATE POLICY tenant_isolation ON %I '
            'USING (tenant_id = reckon_current_tenant()) '
            'WITH CHECK (tenant_id = reckon_current_tenant())', t);
    END LOOP;
END
$$;

INSERT INTO effect (id, tenant_id, source_id, key, operation, key_version, subject, state,
        request_hash, response, attempts, created_at, updated_at, expires_at, abandoned_at,
        first_seen_at, last_changed_at, gone_at, gone_reason, resolved, first_event_id,
        first_origin, first_state, first_attempts, first_updated_at, parked)
    OVERRIDING SYSTEM VALUE
    SELECT id, tenant_id, source_id, key, operation, key_version, subject, state,
        request_hash, response, attempts, created_at, updated_at, expires_at, abandoned_at,
        first_seen_at, last_changed_at, gone_at, gone_reason, resolved, first_event_id,
        first_origin, first_state, first_attempts, first_updated_at, parked
    FROM effect_unpartitioned ORDER BY id;
-- The new identity continues where the old one stopped (ids are never reused: history,
-- verdicts and audit findings name them).
SELECT setval(pg_get_serial_sequence('effect', 'id'), last_value, is_called)
    FROM effect_unpartitioned_id_seq;

INSERT INTO provider_charge (tenant_id, provider_id, charge_id, payment_intent, amount,
        currency, status, amount_captured, amount_refunded, refunds, metadata,
        idempotency_key, customer, created, raw, imported_at)
    SELECT tenant_id, provider_id, charge_id, payment_intent, amount, currency, status,
        amount_captured, amount_refunded, refunds, metadata, idempotency_key, customer,
        created, raw, imported_at
    FROM provider_charge_unpartitioned;

-- Takes the view on the first sights and the foreign keys that named the old table.
DROP TABLE effect_unpartitioned CASCADE;
DROP TABLE provider_charge_unpartitioned;

ALTER TABLE effect ADD CONSTRAINT effect_pkey PRIMARY KEY (id, tenant_id);
ALTER TABLE effect ADD CONSTRAINT effect_tenant_id_source_id_key_key
    UNIQUE (tenant_id, source_id, key);
CREATE INDEX effect_subject ON effect (tenant_id, subject);
CREATE INDEX effect_unresolved ON effect (tenant_id, state, abandoned_at)
    WHERE state IN ('unknown', 'in_progress');
CREATE INDEX effect_created ON effect (tenant_id, created_at);
-- The predicates are, word for word, those of crates/reckon-ledger/src/dashboard.rs and
-- metrics.rs (0023, 0026).
CREATE INDEX effect_metrics_unresolved ON effect (tenant_id, source_id, operation)
    INCLUDE (state, updated_at, expires_at, abandoned_at, created_at, id, parked)
    WHERE (state = 'unknown' OR (state = 'in_progress' AND gone_at IS NULL)) AND NOT resolved;
CREATE INDEX effect_unresolved_since ON effect (tenant_id,
    (CASE WHEN state = 'unknown' THEN updated_at ELSE COALESCE(expires_at, updated_at) END), id)
    WHERE (state = 'unknown' OR (state = 'in_progress' AND gone_at IS NULL)) AND NOT resolved;

ALTER TABLE provider_charge ADD CONSTRAINT provider_charge_pkey
    PRIMARY KEY (tenant_id, provider_id, charge_id);
CREATE INDEX provider_charge_created ON provider_charge (tenant_id, created);
CREATE INDEX provider_charge_id ON provider_charge (tenant_id, charge_id);
CREATE INDEX provider_charge_key ON provider_charge (tenant_id, idempotency_key);

ALTER TABLE reconcile_attempt ADD CONSTRAINT reconcile_attempt_effect_id_fkey
    FOREIGN KEY (effect_id, tenant_id) REFERENCES effect (id, tenant_id);
ALTER TABLE reconcile_state ADD CONSTRAINT reconcile_state_effect_id_fkey
    FOREIGN KEY (effect_id, tenant_id) REFERENCES effect (id, tenant_id);
ALTER TABLE resolution ADD CONSTRAINT resolution_effect_id_fkey
    FOREIGN KEY (effect_id, tenant_id) REFERENCES effect (id, tenant_id);
ALTER TABLE writeback ADD CONSTRAINT writeback_effect_id_fkey
    FOREIGN KEY (effect_id, tenant_id) REFERENCES effect (id, tenant_id);

-- As 0024 made it.
CREATE VIEW effect_history WITH (security_invoker = true) AS
    SELECT id, tenant_id, effect_id, observed_at, origin, kind, from_state, to_state,
           attempts, source_updated_at, detail
    FROM effect_event
    UNION ALL
    SELECT first_event_id, tenant_id, id, first_seen_at, first_origin, 'first_seen',
           NULL, first_state, first_attempts, first_updated_at, NULL
    FROM effect
    WHERE first_event_id IS NOT NULL;

-- The triggers that keep `resolved` and `parked` name the effect's tenant, so each
-- update prunes to its partition when planned, not only when it starts.
CREATE OR REPLACE FUNCTION reckon_mark_resolved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE effect SET resolved = TRUE
            WHERE id = NEW.effect_id AND tenant_id = NEW.tenant_id;
    ELSE
        UPDATE effect SET resolved = FALSE
            WHERE id = OLD.effect_id AND tenant_id = OLD.tenant_id;
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION reckon_mark_parked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        UPDATE effect SET parked = FALSE
            WHERE id = OLD.effect_id AND tenant_id = OLD.tenant_id;
    ELSE
        UPDATE effect SET parked = NEW.needs_attention
            WHERE id = NEW.effect_id AND tenant_id = NEW.tenant_id;
    END IF;
    RETURN NULL;
END $$;

-- As 0004 and 0024 granted them, whoever runs this migration (the partitions, which the
-- application never names, get the schema's default privileges and their own policies).
GRANT SELECT, INSERT, UPDATE, DELETE ON effect, provider_charge TO reckon_app;
GRANT USAGE, SELECT ON SEQUENCE effect_id_seq TO reckon_app;
GRANT SELECT ON effect_history TO reckon_app;
REVOKE INSERT, UPDATE, DELETE ON effect_history FROM reckon_app;

ANALYZE effect;
ANALYZE provider_charge;
