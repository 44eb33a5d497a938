-- Ingest speed (branch perf). The SQLite file of the same name explains its side.
--
-- Foreign keys that every ingested row paid for, row by row, dropped because the one code
-- path that writes these rows keeps their integrity once per batch:
--
-- * effect -> tenant, effect -> source: two index probes and two FOR KEY SHARE row locks
--   per inserted effect (measured: about 45% of an effect INSERT). Effects are inserted
--   only by `PgLedger::ingest`, which first reads the source under the caller's tenant
--   with `SELECT ... FOR KEY SHARE`: the same lock, taken once per batch, plus a check the
--   foreign keys never made (that the source belongs to that tenant). The source keeps its
--   own foreign key to tenant, so the locked source also pins its tenant.
-- * effect_event -> effect/tenant, effect_key_part -> effect/tenant: each history row or
--   lookup part locked its effect (FOR KEY SHARE rewrites the effect's tuple header, so
--   every new effect page was dirtied twice). They are inserted only by
--   `PgLedger::execute_plan` and `mark_gone`, in the same transaction as, and with the id
--   and tenant of, an effect just inserted, updated or read under that tenant.
--
-- No code deletes effects, sources or tenants (reckon never deletes an effect because its
-- source did: ARCHITECTURE.md). A change that adds such a deletion, or another writer of
-- these tables, must keep these rules or bring the constraints back.
ALTER TABLE effect DROP CONSTRAINT effect_tenant_id_fkey;
ALTER TABLE effect DROP CONSTRAINT effect_source_id_fkey;
ALTER TABLE effect_event DROP CONSTRAINT effect_event_effect_id_fkey;
ALTER TABLE effect_event DROP CONSTRAINT effect_event_tenant_id_fkey;
ALTER TABLE effect_key_part DROP CONSTRAINT effect_key_part_effect_id_fkey;
ALTER TABLE effect_key_part DROP CONSTRAINT effect_key_part_tenant_id_fkey;
