-- This ledger's identity: a random value made once, when the ledger is created. A tenant's
-- source connection that can see it has reached reckon's own database (a link or a copy
-- of the file), and is refused. One row for the whole ledger.
CREATE TABLE reckon_instance (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    identity  TEXT NOT NULL
);
INSERT INTO reckon_instance (id, identity)
VALUES (1, 'reckon-ledger-' || lower(hex(randomblob(16))));
