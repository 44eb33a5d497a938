-- Provider answers stored before every answer passed the redactor may hold a credential a
-- provider echoed. The Rust side of `migrate` scrubs them with each tenant's own secrets
-- (which only it can open) and re-links the audit chain it had to change.
INSERT INTO pending_backfill (name) VALUES ('scrub_provider_answers');
