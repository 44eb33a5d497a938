-- Whether the reconciler parked an effect for a person, on the effect itself and in the
-- backlog's covering index: the overview's counts and a tenant's scrape then count the
-- parked ones in their one pass over the backlog, instead of joining every entry to the
-- parked reconcile states (a hash join, a third of the overview's counts at 10M effects)
-- or probing the effect of every parked state (a random read of the effect table each).
-- Kept by the database, in the transaction that parks or requeues, like `resolved` (0023).
ALTER TABLE effect ADD COLUMN parked BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE effect e SET parked = TRUE FROM reconcile_state r
    WHERE r.effect_id = e.id AND r.needs_attention;

CREATE FUNCTION reckon_mark_parked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        UPDATE effect SET parked = FALSE WHERE id = OLD.effect_id;
    ELSE
        UPDATE effect SET parked = NEW.needs_attention WHERE id = NEW.effect_id;
    END IF;
    RETURN NULL;
END $$;
-- Only when the flag changes: a lookup updates its effect's state row every time, and
-- parks it rarely.
CREATE TRIGGER reconcile_state_parks_effect AFTER INSERT ON reconcile_state
    FOR EACH ROW WHEN (NEW.needs_attention) EXECUTE FUNCTION reckon_mark_parked();
CREATE TRIGGER reconcile_state_reparks_effect AFTER UPDATE OF needs_attention ON reconcile_state
    FOR EACH ROW WHEN (OLD.needs_attention IS DISTINCT FROM NEW.needs_attention)
    EXECUTE FUNCTION reckon_mark_parked();
CREATE TRIGGER reconcile_state_unparks_effect AFTER DELETE ON reconcile_state
    FOR EACH ROW WHEN (OLD.needs_attention) EXECUTE FUNCTION reckon_mark_parked();

-- The predicate is unchanged (0023); `parked` joins what the index carries.
DROP INDEX effect_metrics_unresolved;
CREATE INDEX effect_metrics_unresolved ON effect (tenant_id, source_id, operation)
    INCLUDE (state, updated_at, expires_at, abandoned_at, created_at, id, parked)
    WHERE (state = 'unknown' OR (state = 'in_progress' AND gone_at IS NULL)) AND NOT resolved;
