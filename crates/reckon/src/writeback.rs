//! `reckon writeback` (issue 4 item 7): write resolutions back into the rows of sources
//! that opted in, show what a run would do (`--dry-run`), turn a source's write-back on or
//! off (`set`), and read the write-back log (`list`).

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
    #[arg(long)]
    source: Option<String>,
    /// Print each row's diff (before -> after) and write nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Subcommand)]
enum WritebackCmd {
    /// Turn a source's write-back on, with what `not_applied` does (`release` deletes the row
    /// so the application's retry can run, `fail` makes it terminal), or `off`.
    Set {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        source: String,
        /// release | fail | off
        not_applied: String,
    },
    /// The write-back log, one JSON object a line.
    List {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        source: Option<String>,
        /// pending | written | conflict
        #[arg(long)]
        status: Option<String>,
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
        }) => {
            let t = ledger.tenant_by_slug(&tenant).await?;
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
            for w in ledger
                .list_writebacks(t.id, source_id, status, 100_000)
                .await?
            {
                println!("{}", serde_json::to_string(&w)?);
            }
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
            report(&outcomes, args.dry_run)?;
        }
    }
    Ok(())
}

/// One JSON object a line on stdout (the diff: `before` and `after`), a summary on stderr.
fn report(outcomes: &[WritebackOutcome], dry_run: bool) -> anyhow::Result<()> {
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for o in outcomes {
        println!("{}", serde_json::to_string(o)?);
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
