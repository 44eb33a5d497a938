-- Support finds an effect by the ids its application recorded in its row (the stored
-- result's `id`, `charge_id`, `message_id`, ...): ingest writes them as lookup parts in
-- `effect_key_part`. The Rust side of `migrate` writes them for the rows stored before.
INSERT INTO pending_backfill (name) VALUES ('recorded_ids');
