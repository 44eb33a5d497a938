-- The support lookup (dashboard, issue 7) finds imported provider charges by the charge's
-- own id (a support ticket quotes `ch_...`, and the provider is not known) and by the
-- idempotency key the charge was made with (an effect's key). Both are probes of these
-- indexes, never a scan of the tenant's charges.
CREATE INDEX provider_charge_id ON provider_charge (tenant_id, charge_id);
CREATE INDEX provider_charge_key ON provider_charge (tenant_id, idempotency_key);
