-- An effect's first sight, kept in its own row when it was first seen in a batch of new
-- keys (every batch of a first scan): the history row written beside each new effect was a
-- quarter of the server's work in a first scan (a second table and its index, one more
-- row through row-level security, per effect). The values are those the history row held and
-- are never updated; `first_event_id` is drawn from the history's own sequence, so the
-- first sight keeps an id that orders it before every later event of the effect and is
-- unique among all events. Effects first seen otherwise (a batch that mixes new and
-- known keys, and every effect stored before this migration) keep a history row and
-- leave these columns NULL. Readers take the history from `effect_history`, which is both.
ALTER TABLE effect
    ADD COLUMN first_event_id BIGINT,
    ADD COLUMN first_origin TEXT,
    ADD COLUMN first_state TEXT,
    ADD COLUMN first_attempts BIGINT,
    ADD COLUMN first_updated_at DOUBLE PRECISION;

-- security_invoker: the reader's row-level security applies to both tables, as if it
-- read them directly.
CREATE VIEW effect_history WITH (security_invoker = true) AS
SELECT id, tenant_id, effect_id, observed_at, origin, kind, from_state, to_state, attempts,
       source_updated_at, detail
FROM effect_event
UNION ALL
SELECT first_event_id, tenant_id, id, first_seen_at, first_origin, 'first_seen', NULL,
       first_state, first_attempts, first_updated_at, NULL
FROM effect
WHERE first_event_id IS NOT NULL;

-- The default privileges of 0004 granted writes too; a view of a union takes none.
REVOKE INSERT, UPDATE, DELETE ON effect_history FROM reckon_app;
