//! The ledger conformance suite: one set of behaviours, each written once as a story over
//! `Arc<dyn Ledger>`, run against both backends (`sqlite::<name>` and `postgres::<name>`).
//!
//! Run: `cargo test -p reckon-ledger --test conformance` (PostgreSQL at 127.0.0.1:5432 with
//! trust auth, or `RECKON_TEST_PG_URL=postgres://user@host:port/postgres`; an unreachable
//! server fails the PostgreSQL half, it is never skipped).

mod accounts;
mod actions;
mod audits;
mod dashboard;
mod effects;
mod isolation;
mod leases;
mod partitions;
mod providers;
mod queue;
mod reconcile;
mod rls;
mod sources;
mod store;
mod support;
mod tenants;
mod writeback;
use accounts::*;
use actions::*;
use audits::*;
use dashboard::*;
use effects::*;
use isolation::*;
use leases::*;
use providers::*;
use queue::*;
use reconcile::*;
use sources::*;
use store::*;
use tenants::*;
use writeback::*;

use reckon_domain::{
    Disappearance, Limits, QuarantineReason, RawNum, RawRow, Rejected, SourceRecord, State,
    UnresolvedKind, time, validate_row,
};
use reckon_ledger::{
    Cursor, Effect, EffectEvent, EffectQuery, IngestBatch, ItemStatus, Ledger, LedgerError,
    NewSource, Origin, Role, Source, SourceKind, Tenant, TenantId,
};
use secrecy::{ExposeSecret, SecretString};
use std::collections::BTreeSet;
use std::sync::Arc;
use support::{RawDb, batch, push_source};

/// Generates `sqlite::$name` and `postgres::$name` from each story. A story marked
/// `with raw` also gets the backend's database for direct queries.
macro_rules! conformance {
    ($($name:ident => $story:ident $($with:ident $raw:ident)?;)*) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    let db = $crate::support::TestDb::sqlite().await;
                    conformance!(@run db, $story $(, $raw)?);
                    db.finish().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    let db = $crate::support::TestDb::postgres().await;
                    conformance!(@run db, $story $(, $raw)?);
                    db.finish().await;
                }
            )*
        }
    };
    (@run $db:ident, $story:ident) => {
        $crate::$story($db.ledger()).await
    };
    (@run $db:ident, $story:ident, raw) => {
        $crate::$story($db.ledger(), $db.raw.clone()).await
    };
}

conformance! {
    migrating_twice_keeps_everything_and_unknown_url_schemes_are_refused_by_name => story_migrate_and_schemes;
    tenant_slugs_are_unique_plain_and_looked_up_exactly => story_tenants;
    a_token_is_found_by_its_hash_with_its_tenant_and_role => story_tokens;
    sources_belong_to_their_tenant_and_their_dsn_is_stored_only_sealed => story_sources with raw;
    every_record_is_stored_byte_for_byte_with_a_first_seen_event => story_ingest_exact;
    reading_the_same_records_again_writes_nothing => story_ingest_again;
    a_changed_record_updates_the_effect_with_one_changed_event => story_ingest_changed;
    a_first_scan_hint_that_is_wrong_stores_what_an_ordinary_batch_would => story_ingest_expect_new;
    a_large_first_scan_batch_stores_every_byte_and_number_as_given => story_ingest_expect_new_large;
    an_older_observation_never_overwrites_a_newer_one => story_ingest_stale;
    a_hostile_row_is_quarantined_once_and_every_input_row_is_accounted_for => story_quarantine;
    the_scan_cursor_moves_only_when_a_batch_carries_one => story_cursor;
    unknown_rows_and_abandoned_claims_are_unresolved_and_nothing_else_is => story_unresolved;
    a_row_that_leaves_its_source_is_kept_marked_gone_and_can_reappear => story_mark_gone;
    lookup_finds_an_order_in_any_key_part_but_never_a_prefix_or_another_tenant => story_lookup;
    no_read_of_one_tenant_ever_returns_anything_of_another => story_isolation_reads;
    a_tenant_cannot_write_into_another_tenants_source => story_isolation_writes;
    effect_listings_filter_by_source_state_operation_and_time_and_page_by_id => story_list_filters;
    a_lease_has_one_holder_and_a_lost_lease_writes_nothing => story_leases;
    a_lease_whose_present_holder_is_gone_is_taken_over_at_once => story_lease_presence with raw;
    the_metrics_snapshot_groups_every_tenants_unresolved_and_a_tenant_sees_its_own => story_metrics_snapshot;
    the_metrics_snapshot_routes_as_the_reconciler_and_counts_replay_windows_of_routed_effects_only => story_metrics_routes;
    the_metrics_snapshot_reads_each_providers_health_from_its_latest_stored_lookup => story_metrics_provider_health;
    open_effects_are_counted_by_operation_and_a_new_route_makes_the_put_off_ones_due => story_backlog_by_operation;
    a_leased_effect_is_claimed_by_one_worker_until_its_lease_or_schedule_expires => story_rc_claims;
    an_effect_is_claimable_while_open_abandoned_claims_by_time_and_never_before_its_schedule => story_rc_queue;
    open_effects_stored_before_the_reconcilers_queue_are_claimable_after_the_next_migrate => story_rc_queue_backfill with raw;
    the_operators_view_answers_while_background_work_holds_every_connection_of_the_work_pool => story_operator_view_has_its_own_connections with raw;
    an_upgrade_retracts_applied_verdicts_of_the_old_rule_and_makes_them_due => story_rc_upgrade_verdicts with raw;
    an_upgrade_retracts_unwitnessed_absence_and_makes_it_due => story_rc_upgrade_absence with raw;
    a_not_applied_contradicted_by_an_imported_charge_is_retracted_and_parked => story_rc_retract_contradicted with raw;
    an_upgrade_takes_effects_resolved_before_it_out_of_the_backlog => story_rc_upgrade_backlog with raw;
    an_effect_is_resolved_at_most_once_even_when_a_retry_records_again => story_rc_resolution_unique;
    the_resolved_among_a_list_of_effects_are_found_in_one_read_in_their_tenant_only => story_rc_resolved_among;
    providers_keep_their_secret_sealed_and_routes_and_requeue_stay_in_their_tenant => story_rc_providers with raw;
    a_providers_calibration_is_kept_for_its_settings_and_tenant => story_rc_calibration;
    provider_charges_are_upserted_read_by_day_and_stay_in_their_tenant => story_audit_charges;
    audit_runs_chain_per_tenant_and_a_scheduled_day_completes_once => story_audit_runs;
    audit_run_heads_carry_each_providers_part_of_the_runs_that_did_not_complete => story_audit_run_heads;
    writeback_is_off_by_default_one_per_resolution_first_outcome_stands_and_tenant_bound => story_writeback;
    a_sources_mapping_is_kept_as_given_and_write_back_is_refused_for_it => story_mapped_source;
    the_queue_lists_unresolved_unresolved_effects_oldest_first_with_filters_and_keyset_pages => story_dash_queue;
    snapshots_count_the_unresolved_once_per_hour_per_tenant => story_dash_snapshots;
    parked_effects_are_counted_by_the_overview_and_the_scrape_while_in_the_backlog => story_dash_parked;
    a_charge_is_found_by_its_id_or_its_idempotency_key_in_its_tenant_only => story_dash_charge_lookup;
    charges_stored_before_search_terms_get_them_at_the_next_migrate => story_charge_terms_backfill with raw;
    an_effect_is_found_by_an_id_its_recorded_result_names => story_lookup_by_recorded_id;
    rows_stored_before_recorded_ids_were_kept_get_them_at_the_next_migrate => story_recorded_ids_backfill with raw;
    the_audit_log_is_read_about_one_target_newest_first_in_its_tenant_only => story_actions_on;
    credentials_stored_from_providers_before_the_redactor_are_scrubbed_and_the_audit_chain_relinked => story_scrub_stored_answers with raw;
    a_tenants_members_are_listed_with_their_role_there_and_no_one_else => story_dash_members;
    provider_health_counts_the_window_and_keeps_the_newest_error_per_tenant => story_dash_provider_health;
    a_scan_request_makes_a_scanned_source_due_until_a_scan_starts_after_it => story_dash_scan_request;
    the_audit_glance_is_the_newest_run_of_the_day_without_its_findings => story_dash_audit_glance;
}

// Helpers every story may use.

pub(crate) async fn tenant_and_source(
    ledger: &dyn Ledger,
    slug: &str,
    source: &str,
) -> (Tenant, Source) {
    let t = ledger.create_tenant(slug).await.expect("create tenant");
    let s = ledger
        .add_source(t.id, push_source(source))
        .await
        .expect("add source");
    (t, s)
}

/// A valid record; `succeeded` rows carry a response, the others none.
pub(crate) fn rec(key: &str, state: State, updated_at: f64) -> SourceRecord {
    SourceRecord {
        key: key.to_owned(),
        state,
        request_hash: "1:9f86d081884c7d65".to_owned(),
        response: (state == State::Succeeded).then(|| r#"{"id":"ch_1"}"#.to_owned()),
        attempts: 1,
        created_at: updated_at - 1.0,
        updated_at,
        expires_at: None,
    }
}

pub(crate) fn claim(key: &str, updated_at: f64, expires_at: f64) -> SourceRecord {
    SourceRecord {
        expires_at: Some(expires_at),
        ..rec(key, State::InProgress, updated_at)
    }
}

pub(crate) fn raw_row(
    key: &[u8],
    state: &[u8],
    response: Option<&[u8]>,
    updated_at: f64,
) -> RawRow {
    RawRow {
        key: Some(key.to_vec()),
        state: Some(state.to_vec()),
        request_hash: Some(b"1:9f86d081884c7d65".to_vec()),
        response: response.map(<[u8]>::to_vec),
        attempts: RawNum::Int(1),
        created_at: RawNum::Real(updated_at - 0.5),
        updated_at: RawNum::Real(updated_at),
        expires_at: RawNum::Null,
    }
}

pub(crate) fn valid(row: &RawRow) -> SourceRecord {
    validate_row(row, &Limits::default()).expect("a valid row")
}

pub(crate) fn refused(row: &RawRow) -> Rejected {
    validate_row(row, &Limits::default()).expect_err("a hostile row")
}

pub(crate) fn everything() -> EffectQuery {
    EffectQuery {
        limit: 1000,
        now: time::now(),
        ..Default::default()
    }
}

pub(crate) async fn list(ledger: &dyn Ledger, t: TenantId, q: EffectQuery) -> Vec<Effect> {
    ledger.list_effects(t, &q).await.expect("list effects")
}

pub(crate) fn keys(effects: &[Effect]) -> BTreeSet<String> {
    effects.iter().map(|e| e.key.clone()).collect()
}

pub(crate) fn set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| (*k).to_owned()).collect()
}

pub(crate) async fn effect(ledger: &dyn Ledger, t: TenantId, source: &str, key: &str) -> Effect {
    ledger
        .get_effect(t, source, key)
        .await
        .expect("get effect")
        .unwrap_or_else(|| panic!("effect {key:?} of {source} not found"))
        .effect
}

pub(crate) async fn history(
    ledger: &dyn Ledger,
    t: TenantId,
    source: &str,
    key: &str,
) -> Vec<EffectEvent> {
    ledger
        .get_effect(t, source, key)
        .await
        .expect("get effect")
        .unwrap_or_else(|| panic!("effect {key:?} of {source} not found"))
        .history
}

pub(crate) fn kinds(history: &[EffectEvent]) -> Vec<&str> {
    history.iter().map(|e| e.kind.as_str()).collect()
}

pub(crate) fn attempt(
    outcome: &str,
    at: f64,
    next: f64,
    resolve: bool,
) -> reckon_ledger::NewAttempt {
    reckon_ledger::NewAttempt {
        provider_id: None,
        started_at: at,
        finished_at: at,
        outcome: reckon_ledger::Outcome::parse(outcome).expect("an outcome word"),
        method: Some("test".to_owned()),
        error: None,
        evidence: serde_json::json!({ "outcome": outcome, "at": at }),
        next_attempt_at: next,
        non_final: false,
        needs_attention: false,
        resolve,
    }
}

pub(crate) fn stored_charge(
    provider_id: i64,
    id: &str,
    created: f64,
    amount: i64,
) -> reckon_ledger::StoredCharge {
    reckon_ledger::StoredCharge {
        provider_id,
        charge_id: id.into(),
        payment_intent: Some(format!("pi_{id}")),
        amount,
        currency: "usd".into(),
        status: "succeeded".into(),
        amount_captured: amount,
        amount_refunded: 0,
        refunds: serde_json::json!([]),
        metadata: serde_json::json!({"idempotency_key": format!("k-{id}")}),
        idempotency_key: None,
        customer: None,
        created,
        raw: serde_json::json!({"id": id, "object": "charge", "amount": amount}),
        imported_at: 1.0,
    }
}

pub(crate) fn new_run(day: &str, by: &str, status: &str) -> reckon_ledger::NewAuditRun {
    reckon_ledger::NewAuditRun {
        day: day.into(),
        time_zone: "UTC".into(),
        window_start: 0.0,
        window_end: 86_400.0,
        provider: "*".into(),
        triggered_by: by.into(),
        status: status.into(),
        reason: (status == "failed").then(|| "provider pay: page 3: server error".into()),
        started_at: 10.5,
        finished_at: 11.25,
        counts: serde_json::json!({"findings": {"duplicate": 1, "orphan": 0}}),
        findings: serde_json::json!([{"kind": "duplicate", "amount": 4200, "b": {"z": 1, "a": [1.5, null]}}]),
        totals: serde_json::json!([]),
        evidence: serde_json::json!({"pages": [{"page": 1}]}),
    }
}
