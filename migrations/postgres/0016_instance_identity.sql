-- This ledger's identity: a random value made once, when the ledger is created. A tenant's
-- source connection that can see it (the row, or the table's comment, which every user of
-- the database can read in pg_description) has reached reckon's own database, whatever
-- address, port, proxy or name led there, and is refused. No tenant_id: one row for the
-- whole ledger; the application role reads it through the default privileges of 0004.
CREATE TABLE reckon_instance (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    identity  TEXT NOT NULL
);
INSERT INTO reckon_instance (id, identity)
VALUES (1, 'reckon-ledger-' || gen_random_uuid()::text);
DO $$
BEGIN
    EXECUTE format('COMMENT ON TABLE reckon_instance IS %L',
                   (SELECT identity FROM reckon_instance WHERE id = 1));
END
$$;
