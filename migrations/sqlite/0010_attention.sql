-- The effects the reconciler parked for a person, found without reading every reconcile
-- state: the scrape's needs-attention gauge and the dashboard's filter read this index.
CREATE INDEX reconcile_state_attention ON reconcile_state (tenant_id, effect_id) WHERE needs_attention;
