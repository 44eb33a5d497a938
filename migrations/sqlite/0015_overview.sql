-- The dashboard (issue 7).
--
-- "Scan now": a person asks for a scan; the scheduler of any replica treats a source whose
-- request is newer than its last scan's start as due. The request is never cleared: a scan
-- that started after it answers it.
ALTER TABLE source ADD COLUMN scan_requested_at REAL;

-- The overview's provider health: lookups and indeterminate outcomes of the last day per
-- provider (a range of this covering index per provider), and the newest error (the last
-- entry of the partial index).
CREATE INDEX reconcile_attempt_recent
    ON reconcile_attempt (tenant_id, provider_id, finished_at, outcome);
CREATE INDEX reconcile_attempt_failed
    ON reconcile_attempt (tenant_id, provider_id, finished_at) WHERE error IS NOT NULL;
