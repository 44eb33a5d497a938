-- The backlog's partial indexes hold the backlog alone. An effect leaves the backlog when
-- it gets a resolution, but its source may say `unknown` forever (no write-back), so
-- without this flag those indexes kept every effect ever resolved and each read of the
-- backlog probed `resolution` once per entry: the overview, the queue, the scrape and the
-- claims cost what had been resolved, not what is left. The flag is kept by the database
-- itself, in the transaction that inserts or deletes the resolution, so no path that
-- records or retracts a verdict can forget it.
ALTER TABLE effect ADD COLUMN resolved BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE effect e SET resolved = TRUE WHERE EXISTS (SELECT 1 FROM resolution r WHERE r.effect_id = e.id);

CREATE FUNCTION reckon_mark_resolved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE effect SET resolved = TRUE WHERE id = NEW.effect_id;
    ELSE
        UPDATE effect SET resolved = FALSE WHERE id = OLD.effect_id;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER resolution_marks_effect AFTER INSERT OR DELETE ON resolution
    FOR EACH ROW EXECUTE FUNCTION reckon_mark_resolved();

-- The predicates are, word for word, those of crates/reckon-ledger/src/dashboard.rs and
-- metrics.rs, so the planner can prove them.
DROP INDEX effect_metrics_unresolved;
CREATE INDEX effect_metrics_unresolved ON effect (tenant_id, source_id, operation)
    INCLUDE (state, updated_at, expires_at, abandoned_at, created_at, id)
    WHERE (state = 'unknown' OR (state = 'in_progress' AND gone_at IS NULL)) AND NOT resolved;
DROP INDEX effect_unresolved_since;
CREATE INDEX effect_unresolved_since ON effect (tenant_id,
    (CASE WHEN state = 'unknown' THEN updated_at ELSE COALESCE(expires_at, updated_at) END), id)
    WHERE (state = 'unknown' OR (state = 'in_progress' AND gone_at IS NULL)) AND NOT resolved;

-- Row-level security adds this function to every read of a tenant's rows; PostgreSQL
-- plans no parallel scan for a statement that calls a function not marked safe for it.
-- It reads a setting, which PostgreSQL hands to its parallel workers with the rest of the
-- transaction's settings, so the workers see the same tenant as the leader.
ALTER FUNCTION reckon_current_tenant() PARALLEL SAFE;
