-- A provider's last calibration against its tenant's known outcomes. See the SQLite file
-- of the same name.
ALTER TABLE provider ADD COLUMN calibration TEXT;
