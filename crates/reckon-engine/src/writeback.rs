//! Write-back as a step function: [`writeback_next`] takes the tenant's
//! write-back lease, settles write-backs a crash left pending, then writes the next resolved
//! effects of opted-in sources back into their own `justonce_keys` rows:
//!
//! - `applied` -> the row becomes `succeeded`, its response the provider object;
//! - `not_applied` -> per the source's policy, `release` (the row is deleted so the
//!   application's retry can run) or `fail` (terminal).
//!
//! The source and the ledger share no transaction (the seeds' Queen MQ page: a marker kept
//! apart from what it marks leaves a window). The window is made harmless in three steps:
//!
//! 1. the intent (resolution id, the statement's exact inputs) is recorded in the ledger
//!    first, `pending`;
//! 2. the source row is changed by one conditional statement (`WHERE key = ? AND state =
//!    <seen> AND updated_at = <seen>`), and the response reckon writes carries the
//!    resolution id (`reckon_writeback.resolution_id`);
//! 3. the outcome is recorded (`written` or `conflict`).
//!
//! A crash after 1 or 2 leaves `pending`; the next step reads the row: reckon's own write
//! (its resolution id in the response) is recorded as written; the row exactly as seen means
//! the write never happened, and it is made now; anything else is the application's move,
//! a conflict. The conditional statement can match at most once (it changes `updated_at`),
//! so a write-back is never applied twice. A source whose write-back is off never gets a
//! writer ([`reckon_sources::SourceWriter::open`] refuses it).

use reckon_ledger::{
    Lease, Ledger, LedgerError, NewWriteback, Outcome, Source, TenantId, Writeback,
    WritebackAction, WritebackCandidate, WritebackPolicy, WritebackStatus,
};
use reckon_sources::{Change, EgressPolicy, RowNow, SourceWriter, WriteError};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A callback given the key of the row about to be written.
pub type KeyHook = Arc<dyn Fn(&str) + Send + Sync>;

/// Test hooks into the window between reckon's read and its write, and between its write
/// and the ledger's record. Both are off in production (`Default`).
#[derive(Clone, Default)]
pub struct WritebackHooks {
    /// Called with the key after reckon read the row and before its conditional statement:
    /// tests make the application move the row here.
    pub after_read: Option<KeyHook>,
    /// Stop right after the source was written, before the ledger records it: a crash in
    /// the window ([`WritebackError::Stopped`]).
    pub stop_after_write: bool,
}

#[derive(Clone)]
pub struct WritebackOptions {
    /// Who holds the tenant's write-back lease (one per process).
    pub owner: String,
    pub lease_secs: f64,
    /// Write-backs per step.
    pub batch: i64,
    pub hooks: WritebackHooks,
}

impl Default for WritebackOptions {
    fn default() -> Self {
        WritebackOptions {
            owner: format!("reckon-{}-{}", std::process::id(), rand::random::<u32>()),
            lease_secs: 300.0,
            batch: 100,
            hooks: WritebackHooks::default(),
        }
    }
}

pub struct WritebackCtx {
    pub ledger: Arc<dyn Ledger>,
    /// The operator's egress policy: a writer connects only where a scan may.
    pub egress: Arc<EgressPolicy>,
    pub options: WritebackOptions,
}

impl WritebackCtx {
    pub fn new(ledger: Arc<dyn Ledger>, egress: Arc<EgressPolicy>) -> WritebackCtx {
        WritebackCtx {
            ledger,
            egress,
            options: WritebackOptions::default(),
        }
    }
}

/// The row as shown in an outcome or a dry run's diff.
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct RowView {
    pub state: String,
    #[schema(required = true)]
    pub updated_at: Option<f64>,
    #[schema(required = true)]
    pub response: Option<Value>,
}

fn view(r: &RowNow) -> RowView {
    RowView {
        state: r.state.clone(),
        updated_at: r.updated_at,
        response: r.response.as_deref().map(json_or_text),
    }
}

fn json_or_text(t: &str) -> Value {
    serde_json::from_str(t).unwrap_or_else(|_| Value::String(t.to_owned()))
}

/// One write-back (or, in a dry run, what it would do).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct WritebackOutcome {
    /// The ledger's write-back record (`None` in a dry run, or when none was recorded).
    #[schema(required = true)]
    pub writeback_id: Option<i64>,
    pub source: String,
    pub key: String,
    pub effect_id: i64,
    pub resolution_id: i64,
    #[schema(value_type = crate::schema::WritebackAction)]
    pub action: WritebackAction,
    /// `written`, `conflict`, `pending` (the source could not be reached: settled later);
    /// in a dry run `would_write`, `would_conflict`, `would_settle`.
    pub status: String,
    pub detail: String,
    /// Settled from the source row after an interrupted run.
    pub recovered: bool,
    /// The row as reckon read it (`None`: no such row).
    #[schema(required = true)]
    pub before: Option<RowView>,
    /// The row reckon writes (`None`: deleted, a release).
    #[schema(required = true)]
    pub after: Option<RowView>,
}

#[derive(Debug)]
pub enum WritebackStep {
    Done(Vec<WritebackOutcome>),
    /// Nothing to write back (nothing resolved, nothing pending).
    Empty,
    /// Another process holds this tenant's write-back lease (a run that died keeps it
    /// until it expires).
    Busy {
        holder: String,
        until: f64,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum WritebackError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("source {0:?} not found")]
    NoSource(String),
    /// [`WritebackHooks::stop_after_write`]: stopped between the source write and the
    /// ledger record, as a crash would.
    #[error("stopped after the source write, before the ledger record (test hook)")]
    Stopped,
    /// Nothing was written: another run holds the tenant's write-back.
    #[error(
        "write-back of this tenant is held by {holder} until {until:.0} (epoch seconds; a run \
         that died holds it until then): nothing was written, try again after that"
    )]
    Busy { holder: String, until: f64 },
}

/// The marker reckon puts in every response it writes.
pub const MARKER: &str = "reckon_writeback";

/// Does this response carry reckon's write of `resolution_id`?
fn carries(response: Option<&str>, resolution_id: i64) -> bool {
    response
        .and_then(|t| serde_json::from_str::<Value>(t).ok())
        .and_then(|v| v.get(MARKER)?.get("resolution_id")?.as_i64())
        == Some(resolution_id)
}

/// The change for a resolution, or `None` when write-back does not apply to its outcome.
fn action_for(outcome: Outcome, policy: WritebackPolicy) -> Option<WritebackAction> {
    match (outcome, policy) {
        (Outcome::Applied, _) => Some(WritebackAction::Succeed),
        (Outcome::NotApplied, WritebackPolicy::Release) => Some(WritebackAction::Release),
        (Outcome::NotApplied, WritebackPolicy::Fail) => Some(WritebackAction::Fail),
        // duplicate / indeterminate: a person decides; the row stays as it is.
        (Outcome::Duplicate | Outcome::Indeterminate, _) => None,
    }
}

/// The provider object the resolution's evidence names (the reconciler's classification),
/// with only the provider's own fields.
fn provider_object(evidence: &Value) -> Option<serde_json::Map<String, Value>> {
    let objects = evidence.pointer("/classification/objects")?.as_array()?;
    let o = objects
        .iter()
        .find(|o| {
            o.get("money").and_then(Value::as_str) == Some("moved")
                || o.get("money_moved").and_then(Value::as_bool) == Some(true)
        })
        .or_else(|| objects.first())?;
    let mut m = serde_json::Map::new();
    for f in ["id", "object", "status", "amount", "currency", "created"] {
        if let Some(v) = o.get(f) {
            m.insert(f.to_owned(), v.clone());
        }
    }
    Some(m)
}

/// The response text reckon writes: the provider object (applied) with the marker, or the
/// marker alone (fail); none for a release.
fn response_for(c: &WritebackCandidate, action: WritebackAction, at: f64) -> Option<String> {
    let marker = json!({
        "resolution_id": c.resolution.id,
        "outcome": c.resolution.outcome,
        "author": c.resolution.author,
        "written_at": at,
    });
    let mut body = match action {
        WritebackAction::Release => return None,
        WritebackAction::Succeed => provider_object(&c.resolution.evidence).unwrap_or_default(),
        WritebackAction::Fail => serde_json::Map::new(),
    };
    body.insert(MARKER.to_owned(), marker);
    Some(Value::Object(body).to_string())
}

fn after_view(wb: &Writeback) -> Option<RowView> {
    let state = match wb.action {
        WritebackAction::Release => return None,
        WritebackAction::Succeed => "succeeded",
        WritebackAction::Fail => "failed",
    };
    Some(RowView {
        state: state.to_owned(),
        updated_at: Some(wb.new_updated_at),
        response: wb.new_response.as_deref().map(json_or_text),
    })
}

fn plan(c: &WritebackCandidate, policy: WritebackPolicy, at: f64) -> Option<NewWriteback> {
    let action = action_for(c.resolution.outcome, policy)?;
    Some(NewWriteback {
        source_id: c.source_id,
        effect_id: c.effect_id,
        resolution_id: c.resolution.id,
        key: c.key.clone(),
        action,
        seen_state: c.state.clone(),
        seen_updated_at: c.updated_at,
        new_response: response_for(c, action, at),
        new_updated_at: at,
    })
}

/// The plan of a candidate as a not-yet-recorded write-back (for dry runs).
fn unrecorded(c: &WritebackCandidate, n: NewWriteback) -> Writeback {
    Writeback {
        id: 0,
        source_id: c.source_id,
        effect_id: c.effect_id,
        resolution_id: c.resolution.id,
        key: n.key,
        action: n.action,
        seen_state: n.seen_state,
        seen_updated_at: n.seen_updated_at,
        new_response: n.new_response,
        new_updated_at: n.new_updated_at,
        status: WritebackStatus::Pending,
        detail: None,
        recovered: false,
        created_at: n.new_updated_at,
        settled_at: None,
    }
}

/// What the row says about a write-back, before any statement is run.
enum Reading {
    /// The row holds reckon's write of this resolution (or, for a release after an
    /// interrupted run, is gone).
    Ours(&'static str),
    /// Exactly what reckon saw: the write has not happened.
    AsSeen,
    /// The application moved (or the row is gone): nothing may be changed.
    Moved(String),
}

fn read_row(wb: &Writeback, row: Option<&RowNow>, resumed: bool) -> Reading {
    match row {
        Some(r) if carries(r.response.as_deref(), wb.resolution_id) => {
            Reading::Ours("the row holds reckon's write of this resolution")
        }
        Some(r) if r.state == wb.seen_state && r.updated_at == Some(wb.seen_updated_at) => {
            Reading::AsSeen
        }
        // A row claimed after the one reckon saw was deleted (an update in place keeps
        // `created_at`, and the old row's was at most what reckon saw as `updated_at`):
        // the interrupted release took effect, and the application has since claimed the
        // key again, as a release is meant to let it.
        Some(r)
            if resumed
                && wb.action == WritebackAction::Release
                && r.created_at.is_some_and(|c| c > wb.seen_updated_at) =>
        {
            Reading::Ours(
                "the interrupted release took effect and the application has claimed the key \
                 again since (the row is a new claim)",
            )
        }
        Some(r) => Reading::Moved(format!(
            "the application moved first: the row is {:?} updated_at {}, reckon saw {:?} \
             updated_at {}; nothing was changed",
            r.state,
            r.updated_at
                .map_or_else(|| "(not a number)".into(), |u| u.to_string()),
            wb.seen_state,
            wb.seen_updated_at
        )),
        None if resumed && wb.action == WritebackAction::Release => Reading::Ours(
            "the row is gone: the interrupted release took effect (reckon's delete, or the \
             application's own)",
        ),
        None => Reading::Moved(
            "the application moved first: the row is gone; nothing was changed".into(),
        ),
    }
}

fn change_of(wb: &Writeback) -> Change<'_> {
    match wb.action {
        WritebackAction::Release => Change::Delete,
        WritebackAction::Succeed | WritebackAction::Fail => Change::Set {
            state: if wb.action == WritebackAction::Succeed {
                "succeeded"
            } else {
                "failed"
            },
            response: wb.new_response.as_deref().unwrap_or("null"),
            updated_at: wb.new_updated_at,
        },
    }
}

/// One step for every source of the tenant.
pub async fn writeback_next(
    ctx: &WritebackCtx,
    tenant: TenantId,
) -> Result<WritebackStep, WritebackError> {
    writeback_step(ctx, tenant, None).await
}

/// One step for one source (`source` by name) or, with `None`, every source.
pub async fn writeback_step(
    ctx: &WritebackCtx,
    tenant: TenantId,
    source: Option<&str>,
) -> Result<WritebackStep, WritebackError> {
    let o = &ctx.options;
    let Some(lease) = ctx
        .ledger
        .try_lease(&lease_name(tenant), &o.owner, o.lease_secs)
        .await?
    else {
        let holder = ctx.ledger.lease_holder(&lease_name(tenant)).await?;
        return Ok(WritebackStep::Busy {
            holder: holder.as_ref().map_or_else(
                || "another run (it has just let go)".into(),
                |l| l.owner.clone(),
            ),
            until: holder.map_or_else(reckon_domain::time::now, |l| l.expires_at),
        });
    };
    let result = step_leased(ctx, tenant, source, &lease).await;
    if let Err(e) = ctx.ledger.release_lease(&lease).await {
        tracing::warn!(error = %e, "could not release the write-back lease");
    }
    result
}

fn lease_name(tenant: TenantId) -> String {
    format!("writeback:{}", tenant.get())
}

/// Run steps until nothing is left, or a step settles nothing (an unreachable source is
/// tried again by the next run, not in a loop). A lease held by another run before
/// anything was done is an error naming the holder, never "nothing to do".
pub async fn writeback_all(
    ctx: &WritebackCtx,
    tenant: TenantId,
    source: Option<&str>,
) -> Result<Vec<WritebackOutcome>, WritebackError> {
    let mut all = Vec::new();
    loop {
        match writeback_step(ctx, tenant, source).await? {
            WritebackStep::Done(v) => {
                let progress = v.iter().any(|w| w.status != "pending");
                all.extend(v);
                if !progress {
                    break;
                }
            }
            WritebackStep::Empty => break,
            WritebackStep::Busy { holder, until } if all.is_empty() => {
                return Err(WritebackError::Busy { holder, until });
            }
            // Another run took over after this one wrote: the rest is its work.
            WritebackStep::Busy { .. } => break,
        }
    }
    Ok(all)
}

async fn source_filter(
    ctx: &WritebackCtx,
    tenant: TenantId,
    source: Option<&str>,
) -> Result<(Option<i64>, HashMap<i64, Source>), WritebackError> {
    let sources: HashMap<i64, Source> = ctx
        .ledger
        .list_sources(tenant)
        .await?
        .into_iter()
        .map(|s| (s.id, s))
        .collect();
    let id = match source {
        None => None,
        Some(name) => Some(
            sources
                .values()
                .find(|s| s.name == name)
                .map(|s| s.id)
                .ok_or_else(|| WritebackError::NoSource(name.to_owned()))?,
        ),
    };
    Ok((id, sources))
}

/// Pending intents and new candidates, grouped by source.
type Work = BTreeMap<i64, (Vec<Writeback>, Vec<WritebackCandidate>)>;

async fn gather(
    ctx: &WritebackCtx,
    tenant: TenantId,
    source_id: Option<i64>,
) -> Result<Work, WritebackError> {
    let batch = ctx.options.batch.max(1);
    let pending = ctx
        .ledger
        .list_writebacks(tenant, source_id, Some(WritebackStatus::Pending), batch)
        .await?;
    let room = batch - pending.len() as i64;
    let fresh = if room > 0 {
        ctx.ledger
            .writeback_candidates(tenant, source_id, room)
            .await?
    } else {
        Vec::new()
    };
    let mut work = Work::new();
    for p in pending {
        work.entry(p.source_id).or_default().0.push(p);
    }
    for c in fresh {
        work.entry(c.source_id).or_default().1.push(c);
    }
    Ok(work)
}

async fn open_writer(
    ctx: &WritebackCtx,
    tenant: TenantId,
    source: &Source,
) -> Result<SourceWriter, String> {
    let dsn = ctx
        .ledger
        .source_dsn(tenant, source)
        .await
        .map_err(|e| e.to_string())?;
    // A SQLite source must be in its tenant's own directory (T12): the policy is told
    // whose source this is.
    let slug = ctx
        .ledger
        .tenant_by_id(tenant)
        .await
        .map_err(|e| e.to_string())?
        .slug;
    SourceWriter::open(source, &dsn, &ctx.egress.for_tenant(&slug))
        .await
        .map_err(|e| e.to_string())
}

fn outcome(
    source: &str,
    wb: &Writeback,
    status: &str,
    detail: String,
    before: Option<&RowNow>,
) -> WritebackOutcome {
    WritebackOutcome {
        writeback_id: (wb.id != 0).then_some(wb.id),
        source: source.to_owned(),
        key: wb.key.clone(),
        effect_id: wb.effect_id,
        resolution_id: wb.resolution_id,
        action: wb.action,
        status: status.to_owned(),
        detail,
        recovered: wb.recovered,
        before: before.map(view),
        after: after_view(wb),
    }
}

async fn step_leased(
    ctx: &WritebackCtx,
    tenant: TenantId,
    source: Option<&str>,
    lease: &Lease,
) -> Result<WritebackStep, WritebackError> {
    let (source_id, sources) = source_filter(ctx, tenant, source).await?;
    let work = gather(ctx, tenant, source_id).await?;
    if work.is_empty() {
        return Ok(WritebackStep::Empty);
    }
    let mut out = Vec::new();
    for (sid, (pending, fresh)) in work {
        let Some(src) = sources.get(&sid) else {
            continue;
        };
        if src.writeback().is_none() {
            // Turned off after an intent was recorded: never write; the intent waits.
            for wb in &pending {
                out.push(outcome(
                    &src.name,
                    wb,
                    "pending",
                    "write-back is off for this source now: left pending, nothing written".into(),
                    None,
                ));
            }
            continue;
        }
        let mut writer = match open_writer(ctx, tenant, src).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(source = %src.name, error = %e, "write-back: source unreachable");
                for wb in &pending {
                    out.push(outcome(&src.name, wb, "pending", e.clone(), None));
                }
                // Candidates get no intent: nothing was attempted.
                continue;
            }
        };
        let result = run_source(ctx, tenant, lease, src, &mut writer, pending, fresh).await;
        writer.close().await;
        out.extend(result?);
    }
    Ok(WritebackStep::Done(out))
}

async fn run_source(
    ctx: &WritebackCtx,
    tenant: TenantId,
    lease: &Lease,
    src: &Source,
    writer: &mut SourceWriter,
    pending: Vec<Writeback>,
    fresh: Vec<WritebackCandidate>,
) -> Result<Vec<WritebackOutcome>, WritebackError> {
    let mut out = Vec::new();
    for wb in pending {
        out.push(settle(ctx, tenant, lease, &src.name, writer, wb, true).await?);
    }
    for c in fresh {
        let at = reckon_domain::time::now();
        let Some(new) = plan(&c, writer.policy(), at) else {
            continue;
        };
        let blocked = contradicted(ctx, tenant, &c).await?;
        // 1. The intent, before the source is touched.
        let wb = ctx.ledger.begin_writeback(tenant, new, Some(lease)).await?;
        if wb.status != WritebackStatus::Pending {
            continue; // settled by someone else meanwhile
        }
        if let Some(why) = blocked {
            // Never written: handing the key back would let the application charge again.
            let settled = ctx
                .ledger
                .finish_writeback(
                    tenant,
                    wb.id,
                    WritebackStatus::Conflict,
                    &why,
                    false,
                    Some(lease),
                )
                .await?;
            out.push(outcome(&src.name, &settled, "conflict", why, None));
            continue;
        }
        out.push(settle(ctx, tenant, lease, &src.name, writer, wb, false).await?);
    }
    Ok(out)
}

/// Why a verdict of absence must not be written back: the provider's charges imported by
/// the audit hold one carrying the effect's key that moved money. `None`: nothing
/// contradicts it (or it is not a verdict of absence).
async fn contradicted(
    ctx: &WritebackCtx,
    tenant: TenantId,
    c: &WritebackCandidate,
) -> Result<Option<String>, WritebackError> {
    if c.resolution.outcome != Outcome::NotApplied {
        return Ok(None);
    }
    let key = [c.key.clone()];
    let charges = ctx
        .ledger
        .charges_by_ids_or_keys(tenant, &key, &key, 20)
        .await?;
    let paid: Vec<String> = charges
        .iter()
        .filter(|ch| {
            reckon_domain::ChargeStatus::from_stored(&ch.status).is_paid() && ch.amount_captured > 0
        })
        .map(|ch| ch.charge_id.clone())
        .collect();
    Ok((!paid.is_empty()).then(|| {
        format!(
            "not written: the verdict was not charged, but the provider lists {} carrying this \
             key; a person must check before the application may try again",
            paid.join(", ")
        )
    }))
}

/// Read the row, write if it is still as seen, record the outcome. `resumed`: the intent
/// was found pending (an earlier run stopped somewhere after recording it).
async fn settle(
    ctx: &WritebackCtx,
    tenant: TenantId,
    lease: &Lease,
    source: &str,
    writer: &mut SourceWriter,
    wb: Writeback,
    resumed: bool,
) -> Result<WritebackOutcome, WritebackError> {
    let row = match writer.read(&wb.key).await {
        Ok(r) => r,
        Err(e) => return Ok(unreachable_outcome(source, &wb, e)),
    };
    let (status, detail, recovered) = match read_row(&wb, row.as_ref(), resumed) {
        Reading::Ours(why) => (WritebackStatus::Written, why.to_owned(), resumed),
        Reading::Moved(why) => (WritebackStatus::Conflict, why, false),
        Reading::AsSeen => {
            if let Some(hook) = &ctx.options.hooks.after_read {
                hook(&wb.key);
            }
            // 2. The one conditional statement.
            let n = match writer
                .apply(&wb.key, &wb.seen_state, wb.seen_updated_at, change_of(&wb))
                .await
            {
                Ok(n) => n,
                Err(e) => return Ok(unreachable_outcome(source, &wb, e)),
            };
            if ctx.options.hooks.stop_after_write {
                return Err(WritebackError::Stopped);
            }
            if n >= 1 {
                (WritebackStatus::Written, "written".to_owned(), false)
            } else {
                // Zero rows: someone moved between the read and the write. If it was
                // reckon itself (another worker), its marker is there.
                match writer.read(&wb.key).await {
                    Ok(Some(r)) if carries(r.response.as_deref(), wb.resolution_id) => (
                        WritebackStatus::Written,
                        "the row holds reckon's write of this resolution".to_owned(),
                        false,
                    ),
                    Ok(now) => (
                        WritebackStatus::Conflict,
                        format!(
                            "the application moved first: the row changed between reckon's read \
                             and its conditional {}, which affected no row; the application's {} \
                             stands",
                            if wb.action == WritebackAction::Release {
                                "DELETE"
                            } else {
                                "UPDATE"
                            },
                            match &now {
                                Some(r) => format!("row ({:?})", r.state),
                                None => "deletion".into(),
                            }
                        ),
                        false,
                    ),
                    Err(e) => return Ok(unreachable_outcome(source, &wb, e)),
                }
            }
        }
    };
    // 3. The outcome.
    let settled = ctx
        .ledger
        .finish_writeback(tenant, wb.id, status, &detail, recovered, Some(lease))
        .await?;
    Ok(outcome(
        source,
        &settled,
        settled.status.as_str(),
        settled.detail.clone().unwrap_or(detail),
        row.as_ref(),
    ))
}

fn unreachable_outcome(source: &str, wb: &Writeback, e: WriteError) -> WritebackOutcome {
    tracing::warn!(source, key = %wb.key, error = %e, "write-back left pending");
    outcome(
        source,
        wb,
        "pending",
        format!("left pending, settled by the next run: {e}"),
        None,
    )
}

/// What a step would do, with each row's diff (before -> after). Writes nothing: neither
/// the source nor the ledger (no intent, no lease).
pub async fn writeback_dry_run(
    ctx: &WritebackCtx,
    tenant: TenantId,
    source: Option<&str>,
) -> Result<Vec<WritebackOutcome>, WritebackError> {
    let (source_id, sources) = source_filter(ctx, tenant, source).await?;
    let work = gather(ctx, tenant, source_id).await?;
    let mut out = Vec::new();
    for (sid, (pending, fresh)) in work {
        let Some(src) = sources.get(&sid) else {
            continue;
        };
        let Some(policy) = src.writeback() else {
            continue;
        };
        let mut items: Vec<(Writeback, bool)> = pending.into_iter().map(|w| (w, true)).collect();
        let at = reckon_domain::time::now();
        let mut blocked = Vec::new();
        for c in &fresh {
            if let Some(n) = plan(c, policy, at) {
                match contradicted(ctx, tenant, c).await? {
                    Some(why) => blocked.push((unrecorded(c, n), why)),
                    None => items.push((unrecorded(c, n), false)),
                }
            }
        }
        for (wb, why) in &blocked {
            out.push(outcome(&src.name, wb, "would_conflict", why.clone(), None));
        }
        let mut writer = match open_writer(ctx, tenant, src).await {
            Ok(w) => w,
            Err(e) => {
                for (wb, _) in &items {
                    out.push(outcome(&src.name, wb, "unreachable", e.clone(), None));
                }
                continue;
            }
        };
        for (wb, resumed) in items {
            let row = match writer.read(&wb.key).await {
                Ok(r) => r,
                Err(e) => {
                    out.push(outcome(&src.name, &wb, "unreachable", e.to_string(), None));
                    continue;
                }
            };
            let (status, detail) = match read_row(&wb, row.as_ref(), resumed) {
                Reading::Ours(why) => ("would_settle", why.to_owned()),
                Reading::AsSeen => ("would_write", "the row is as reckon saw it".to_owned()),
                Reading::Moved(why) => ("would_conflict", why),
            };
            out.push(outcome(&src.name, &wb, status, detail, row.as_ref()));
        }
        writer.close().await;
    }
    Ok(out)
}
