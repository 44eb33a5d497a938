//! `reckon writeback`: write resolutions back into the rows of sources
//! that opted in, show what a run would do (`--dry-run`), turn a source's write-back on or
//! off (`set`), and read the write-back log (`list`).

use crate::Format;
use crate::output::{rows, when, when_opt};
use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use reckon_engine::writeback::{WritebackCtx, WritebackOutcome, writeback_all, writeback_dry_run};
use reckon_ledger::{Ledger, WritebackPolicy, WritebackStatus};
use reckon_sources::EgressPolicy;
use std::sync::Arc;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct WritebackArgs {
    #[command(subcommand)]
    cmd: Option<WritebackCmd>,
    /// Write back the tenant's resolved effects (every opted-in source, or `--source`).
    #[arg(long)]
    tenant: Option<String>,
    /// Only this source.
    #[arg(long)]
    source: Option<String>,
    /// Show each row's diff (before -> after) and write nothing.
    #[arg(long)]
    dry_run: bool,
    /// How to print the outcomes (json carries each row before and after).
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

#[derive(Subcommand)]
enum WritebackCmd {
    /// Turn a source's write-back on, with what `not_applied` does (`release` deletes the row
    /// so the application's retry can run, `fail` makes it terminal), or `off`.
    Set {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// The source's name.
        #[arg(long)]
        source: String,
        /// What a `not_applied` verdict does: release | fail, or off (no write-back).
        not_applied: String,
    },
    /// The write-back log: each write-back with its status.
    List {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// Only this source's write-backs.
        #[arg(long)]
        source: Option<String>,
        /// pending | written | conflict
        #[arg(long)]
        status: Option<String>,
        /// How to print the list.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
}

pub async fn run(
    ledger: Arc<dyn Ledger>,
    args: WritebackArgs,
    egress: EgressPolicy,
) -> anyhow::Result<()> {
    match args.cmd {
        Some(WritebackCmd::Set {
            tenant,
            source,
            not_applied,
        }) => {
            let policy = match not_applied.as_str() {
                "off" => None,
                p => Some(
                    WritebackPolicy::parse(p)
                        .with_context(|| format!("{p:?} is not one of release, fail, off"))?,
                ),
            };
            let t = ledger.tenant_by_slug(&tenant).await?;
            let s = ledger.set_source_writeback(t.id, &source, policy).await?;
            match s.writeback() {
                Some(p) => eprintln!(
                    "write-back of {} is on: applied -> succeeded, not_applied -> {}",
                    s.name,
                    p.as_str()
                ),
                None => eprintln!("write-back of {} is off: reckon never writes to it", s.name),
            }
        }
        Some(WritebackCmd::List {
            tenant,
            source,
            status,
            format,
        }) => {
            let t = ledger.tenant_by_slug(&tenant).await?;
            let tz = crate::output::tenant_zone(ledger.as_ref(), t.id).await?;
            let source_id = match source {
                Some(name) => Some(ledger.source_by_name(t.id, &name).await?.id),
                None => None,
            };
            let status = status
                .map(|s| {
                    WritebackStatus::parse(&s)
                        .with_context(|| format!("{s:?} is not one of pending, written, conflict"))
                })
                .transpose()?;
            let list = ledger
                .list_writebacks(t.id, source_id, status, 100_000)
                .await?;
            rows(
                &list,
                format,
                &[
                    "id", "key", "action", "status", "detail", "created", "settled",
                ],
                |w| {
                    vec![
                        w.id.to_string(),
                        w.key.clone(),
                        w.action.as_str().to_owned(),
                        w.status.as_str().to_owned(),
                        w.detail.clone().unwrap_or_default(),
                        when(w.created_at, &tz),
                        when_opt(w.settled_at, &tz),
                    ]
                },
            )?;
        }
        None => {
            let Some(tenant) = args.tenant else {
                bail!("reckon writeback needs --tenant (or a subcommand: set, list)");
            };
            let t = ledger.tenant_by_slug(&tenant).await?;
            let ctx = WritebackCtx::new(ledger.clone(), Arc::new(egress));
            let source = args.source.as_deref();
            let outcomes = if args.dry_run {
                writeback_dry_run(&ctx, t.id, source).await?
            } else {
                writeback_all(&ctx, t.id, source).await?
            };
            report(&outcomes, args.dry_run, args.format)?;
        }
    }
    Ok(())
}

/// The outcomes on stdout (as JSON with each row's `before` and `after`), a summary on
/// stderr.
fn report(outcomes: &[WritebackOutcome], dry_run: bool, format: Format) -> anyhow::Result<()> {
    rows(
        outcomes,
        format,
        &["source", "key", "action", "status", "detail"],
        |o| {
            vec![
                o.source.clone(),
                o.key.clone(),
                o.action.as_str().to_owned(),
                o.status.clone(),
                o.detail.clone(),
            ]
        },
    )?;
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for o in outcomes {
        *counts.entry(o.status.as_str()).or_default() += 1;
    }
    let summary: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    eprintln!(
        "{}write-back: {}",
        if dry_run {
            "dry run, nothing written: "
        } else {
            ""
        },
        if summary.is_empty() {
            "nothing to do".to_owned()
        } else {
            summary.join(", ")
        }
    );
    Ok(())
}
