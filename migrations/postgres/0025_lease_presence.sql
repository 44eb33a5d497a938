-- Whether the lease's holder keeps a mark of its presence that ends with its process (an
-- advisory lock held by a session of its own, see crates/reckon-ledger/src/lease.rs). A
-- lease held with that mark is free to the next taker as soon as the mark is gone, instead
-- of at the end of its term; a lease held without it waits for its term as before.
ALTER TABLE work_lease ADD COLUMN present BOOLEAN NOT NULL DEFAULT FALSE;
