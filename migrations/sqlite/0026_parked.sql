-- Whether the reconciler parked an effect for a person, on the effect itself and in the
-- backlog's covering index: the overview's counts and the scrape count the parked ones in
-- their one pass over the backlog instead of joining it to the parked reconcile states.
-- Kept by the database, in the transaction that parks or requeues, like `resolved` (0023).
ALTER TABLE effect ADD COLUMN parked INTEGER NOT NULL DEFAULT 0;
UPDATE effect SET parked = 1
    WHERE id IN (SELECT effect_id FROM reconcile_state WHERE needs_attention);

CREATE TRIGGER reconcile_state_parks_effect AFTER INSERT ON reconcile_state
    WHEN NEW.needs_attention
BEGIN
    UPDATE effect SET parked = 1 WHERE id = NEW.effect_id;
END;
CREATE TRIGGER reconcile_state_reparks_effect AFTER UPDATE OF needs_attention ON reconcile_state
    WHEN OLD.needs_attention IS NOT NEW.needs_attention
BEGIN
    UPDATE effect SET parked = NEW.needs_attention WHERE id = NEW.effect_id;
END;
CREATE TRIGGER reconcile_state_unparks_effect AFTER DELETE ON reconcile_state
    WHEN OLD.needs_attention
BEGIN
    UPDATE effect SET parked = 0 WHERE id = OLD.effect_id;
END;

-- The predicate is unchanged (0023), word for word as the queries repeat it.
DROP INDEX effect_metrics_unresolved;
CREATE INDEX effect_metrics_unresolved ON effect (tenant_id, source_id, operation,
    state, updated_at, expires_at, abandoned_at, created_at, parked)
    WHERE (state = 'unknown' OR (state = 'in_progress' AND gone_at IS NULL)) AND NOT resolved;
