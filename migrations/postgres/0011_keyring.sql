-- A value sealed under the master key when the ledger is created: a start with another key
-- (a lost key file, a replica without RECKON_MASTER_KEY) is refused instead of running with
-- secrets it cannot open. Re-sealed by `reckon keys rotate`. One row.
CREATE TABLE keyring_check (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    sealed      BYTEA NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL
);
