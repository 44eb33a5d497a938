-- The same history view as PostgreSQL's (see migrations/postgres/0024_first_sight.sql).
-- This ledger writes every first sight as a history row, so the columns stay NULL here;
-- they exist so that both ledgers read the history with the same statement.
ALTER TABLE effect ADD COLUMN first_event_id INTEGER;
ALTER TABLE effect ADD COLUMN first_origin TEXT;
ALTER TABLE effect ADD COLUMN first_state TEXT;
ALTER TABLE effect ADD COLUMN first_attempts INTEGER;
ALTER TABLE effect ADD COLUMN first_updated_at REAL;

CREATE VIEW effect_history AS
SELECT id, tenant_id, effect_id, observed_at, origin, kind, from_state, to_state, attempts,
       source_updated_at, detail
FROM effect_event
UNION ALL
SELECT first_event_id, tenant_id, id, first_seen_at, first_origin, 'first_seen', NULL,
       first_state, first_attempts, first_updated_at, NULL
FROM effect
WHERE first_event_id IS NOT NULL;
