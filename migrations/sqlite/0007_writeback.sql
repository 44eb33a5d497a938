-- Write-back (issue 4 item 7): reckon writes a resolution back into the source's own
-- justonce_keys row, only for sources that opted in. SQLite dialect; the PostgreSQL file of
-- the same name holds the same schema.

-- NULL: write-back is off (the default; such a source is never written to). Otherwise the
-- not_applied policy: 'release' deletes the row so the application's retry can run, 'fail'
-- makes it terminal. `applied` always becomes `succeeded`.
ALTER TABLE source ADD COLUMN writeback TEXT;

-- One write-back per resolution (UNIQUE), recorded as an intent BEFORE the source is
-- written: the source and the ledger share no transaction, so a crash between the two
-- leaves a 'pending' row here, and the next run settles it by reading the source row (the
-- row reckon writes carries resolution_id in its response). A write-back is never applied
-- twice: its statement is conditional on the state and updated_at reckon saw
-- (seen_state, seen_updated_at), and a second run finds either its own write or a row the
-- application moved.
CREATE TABLE writeback (
    id               INTEGER PRIMARY KEY,
    tenant_id        INTEGER NOT NULL REFERENCES tenant(id),
    source_id        INTEGER NOT NULL REFERENCES source(id),
    effect_id        INTEGER NOT NULL REFERENCES effect(id),
    resolution_id    INTEGER NOT NULL UNIQUE REFERENCES resolution(id),
    key              TEXT NOT NULL,
    -- 'succeed' | 'release' | 'fail'
    action           TEXT NOT NULL,
    seen_state       TEXT NOT NULL,
    seen_updated_at  REAL NOT NULL,
    -- The JSON text written into `response` (NULL for a release, which deletes the row).
    new_response     TEXT,
    new_updated_at   REAL NOT NULL,
    -- 'pending' (intent recorded, outcome not yet known) | 'written' | 'conflict'
    status           TEXT NOT NULL,
    detail           TEXT,
    -- Settled by reading the source after an interrupted run, not by the run that wrote.
    recovered        BOOLEAN NOT NULL DEFAULT FALSE,
    created_at       REAL NOT NULL,
    settled_at       REAL
);
CREATE INDEX writeback_status ON writeback (tenant_id, status, id);
CREATE INDEX writeback_effect ON writeback (effect_id);
