-- Work that exactly one replica may do at a time (a source's scan, a day's audit, a
-- scheduled job) is claimed here: the holder, until when, and a term that grows each time
-- the work changes hands. Writes made on the lease's behalf check it inside their own
-- transaction, so a replica that was paused past its lease writes nothing.
CREATE TABLE work_lease (
    name        TEXT PRIMARY KEY,
    owner       TEXT NOT NULL,
    term        BIGINT NOT NULL,
    acquired_at DOUBLE PRECISION NOT NULL,
    expires_at  DOUBLE PRECISION NOT NULL
);
