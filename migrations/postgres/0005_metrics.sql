-- Scrape-time metrics (issue 5). /metrics groups the unresolved effects by tenant, source
-- and operation at every scrape; this partial index holds only unknown effects and claims
-- still present in their source, so a scrape reads O(unresolved + live claims) index
-- entries however large the ledger grows. Released claims (gone_at set) leave the index:
-- they are never unresolved, and they accumulate forever. The WHERE clause is, word for
-- word, the one in crates/reckon-ledger/src/metrics.rs, so the planner can prove it.
-- INCLUDE makes the scan index-only (every column the query reads is in the index).
CREATE INDEX effect_metrics_unresolved ON effect (tenant_id, source_id, operation)
    INCLUDE (state, updated_at, expires_at, abandoned_at, created_at)
    WHERE (state = 'unknown' OR (state = 'in_progress' AND gone_at IS NULL));
