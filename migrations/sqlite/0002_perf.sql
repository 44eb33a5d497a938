-- Ingest speed (branch perf). The PostgreSQL file of the same name drops the foreign keys
-- of effect_event and effect_key_part, which cost PostgreSQL a row lock on the effect per
-- history row. SQLite checks a foreign key with one primary-key probe and no lock, and
-- cannot drop a constraint without rebuilding the table, so they stay here: this file only
-- keeps the two backends' migration names identical.
SELECT 1;
