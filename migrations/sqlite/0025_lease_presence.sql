-- As migrations/postgres/0025_lease_presence.sql; the mark of presence is a lock on a file
-- beside the ledger's.
ALTER TABLE work_lease ADD COLUMN present INTEGER NOT NULL DEFAULT 0;
