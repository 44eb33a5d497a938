-- The backlog's partial indexes hold the backlog alone. An effect leaves the backlog when
-- it gets a resolution, but its source may say `unknown` forever (no write-back), so
-- without this flag those indexes kept every effect ever resolved and each read of the
-- backlog probed `resolution` once per entry. The flag is kept by the database itself, in
-- the transaction that inserts or deletes the resolution, so no path that records or
-- retracts a verdict can forget it.
ALTER TABLE effect ADD COLUMN resolved INTEGER NOT NULL DEFAULT 0;
UPDATE effect SET resolved = 1 WHERE id IN (SELECT effect_id FROM resolution);

CREATE TRIGGER resolution_marks_effect AFTER INSERT ON resolution
BEGIN
    UPDATE effect SET resolved = 1 WHERE id = NEW.effect_id;
END;
CREATE TRIGGER resolution_unmarks_effect AFTER DELETE ON resolution
BEGIN
    UPDATE effect SET resolved = 0 WHERE id = OLD.effect_id;
END;

-- SQLite uses a partial index only where the query repeats each term of its WHERE: these
-- are, word for word, those of crates/reckon-ledger/src/dashboard.rs and metrics.rs.
DROP INDEX effect_metrics_unresolved;
CREATE INDEX effect_metrics_unresolved ON effect (tenant_id, source_id, operation,
    state, updated_at, expires_at, abandoned_at, created_at)
    WHERE (state = 'unknown' OR (state = 'in_progress' AND gone_at IS NULL)) AND NOT resolved;
DROP INDEX effect_unresolved_since;
CREATE INDEX effect_unresolved_since ON effect (tenant_id,
    (CASE WHEN state = 'unknown' THEN updated_at ELSE COALESCE(expires_at, updated_at) END), id)
    WHERE (state = 'unknown' OR (state = 'in_progress' AND gone_at IS NULL)) AND NOT resolved;
