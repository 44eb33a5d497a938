//! `reckon audit`: run the double-charge audit of a day, show stored runs, check
//! the chain, and set the tenant's zone and nightly time.

use crate::Format;
use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use reckon_engine::audit::{AuditCtx, AuditRequest, findings_csv, run_audit, set_settings, verify};
use reckon_engine::read::audit_day;
use reckon_ledger::{AuditRun, Ledger};
use std::sync::Arc;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AuditArgs {
    #[command(subcommand)]
    pub cmd: Option<AuditCmd>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Run the audit of a day now (import the provider's charges, match, store the run).
#[derive(Args)]
pub struct RunArgs {
    /// The tenant's slug (required to run an audit).
    #[arg(long)]
    pub tenant: Option<String>,
    /// YYYY-MM-DD in the tenant's time zone (default: yesterday there).
    #[arg(long)]
    pub date: Option<String>,
    /// One provider by name (default: all of the tenant's).
    #[arg(long)]
    pub provider: Option<String>,
    /// How to print the run (csv: one row per finding).
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

#[derive(Subcommand)]
pub enum AuditCmd {
    /// Check the tenant's chain of runs: exit 1 when a run was edited or removed.
    Verify {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
    },
    /// Print a stored run (nothing is run).
    Show {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// The run's id, from `reckon audit list`.
        id: i64,
        /// How to print the run (csv: one row per finding).
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// The tenant's runs, newest first (of one day with --date).
    List {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// Only the runs of this day (YYYY-MM-DD).
        #[arg(long)]
        date: Option<String>,
        /// How to print the list.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// The tenant's time zone (IANA name; days are cut at its midnights) and the local time
    /// of the nightly audit of yesterday (HH:MM). Without flags: print them.
    Settings {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// Set the time zone, e.g. Europe/Paris.
        #[arg(long)]
        time_zone: Option<String>,
        /// Set the local time of the nightly audit, HH:MM.
        #[arg(long)]
        at: Option<String>,
    },
}

pub async fn run(
    ledger: Arc<dyn Ledger>,
    args: AuditArgs,
    egress: Arc<reckon_sources::EgressPolicy>,
) -> anyhow::Result<()> {
    match args.cmd {
        None => {
            let r = args.run;
            let Some(tenant) = r.tenant else {
                bail!("--tenant is required (or use a subcommand: verify, show, list, settings)")
            };
            let t = ledger.tenant_by_slug(&tenant).await?;
            let mut ctx = AuditCtx::new(ledger.clone());
            ctx.egress = egress;
            let req = AuditRequest {
                date: r.date,
                provider: r.provider,
                triggered_by: "operator".into(),
                now: reckon_domain::time::now(),
            };
            let run = run_audit(&ctx, t.id, &req, None).await?;
            print_run(&run, r.format)?;
            if run.run.status != "complete" {
                bail!(
                    "the audit of {} is {}: {}",
                    run.run.day,
                    if run.run.status == "partial" {
                        "partial (the other providers' findings are stored)"
                    } else {
                        "failed"
                    },
                    run.run.reason.as_deref().unwrap_or("unknown reason")
                );
            }
        }
        Some(AuditCmd::Verify { tenant }) => {
            let t = ledger.tenant_by_slug(&tenant).await?;
            let (n, breaks) = verify(ledger.as_ref(), t.id).await?;
            if breaks.is_empty() {
                println!("audit chain of {tenant}: {n} runs, intact");
            } else {
                for b in &breaks {
                    println!("run {} (seq {}): {}", b.id, b.seq, b.reason);
                }
                bail!(
                    "audit chain of {tenant}: {} of {n} runs do not check out",
                    breaks.len()
                );
            }
        }
        Some(AuditCmd::Show { tenant, id, format }) => {
            let t = ledger.tenant_by_slug(&tenant).await?;
            let run = audit_day::run(ledger.as_ref(), t.id, id)
                .await?
                .with_context(|| format!("no audit run {id} in tenant {tenant}"))?;
            print_run(&run, format)?;
        }
        Some(AuditCmd::List {
            tenant,
            date,
            format,
        }) => {
            let t = ledger.tenant_by_slug(&tenant).await?;
            let (tz, runs) =
                audit_day::run_lines(ledger.as_ref(), t.id, date.as_deref(), 100).await?;
            crate::output::rows(
                &runs,
                format,
                &[
                    "id", "day", "provider", "by", "status", "findings", "finished", "reason",
                ],
                |l| {
                    let r = &l.run;
                    vec![
                        r.id.to_string(),
                        r.run.day.clone(),
                        r.run.provider.clone(),
                        r.run.triggered_by.clone(),
                        r.run.status.clone(),
                        l.findings.to_string(),
                        crate::output::when(r.run.finished_at, &tz),
                        r.run.reason.clone().unwrap_or_default(),
                    ]
                },
            )?;
        }
        Some(AuditCmd::Settings {
            tenant,
            time_zone,
            at,
        }) => {
            let t = ledger.tenant_by_slug(&tenant).await?;
            let s = if time_zone.is_some() || at.is_some() {
                set_settings(ledger.as_ref(), t.id, time_zone.as_deref(), at.as_deref()).await?
            } else {
                ledger.audit_settings(t.id).await?
            };
            println!("time_zone = {}\naudit_time = {}", s.time_zone, s.audit_time);
        }
    }
    Ok(())
}

fn print_run(run: &AuditRun, format: Format) -> anyhow::Result<()> {
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(run)?),
        Format::Csv => print!("{}", findings_csv(run)?),
        Format::Table => {
            let r = &run.run;
            println!(
                "audit {} of {} ({}), provider {}: {}{}",
                run.id,
                r.day,
                r.time_zone,
                r.provider,
                r.status,
                r.reason
                    .as_deref()
                    .map(|x| format!(" ({x})"))
                    .unwrap_or_default()
            );
            let mut b = tabled::builder::Builder::default();
            b.push_record(["kind", "at stake", "summary", "what to do"]);
            for f in run.findings()? {
                b.push_record([
                    f.kind.as_str().to_owned(),
                    f.at_stake_words().unwrap_or_default(),
                    f.summary.clone(),
                    f.action_words(),
                ]);
            }
            println!("{}", b.build());
            let mut t = tabled::builder::Builder::default();
            t.push_record([
                "currency",
                "charged",
                "refunded",
                "net",
                "matched",
                "unmatched",
            ]);
            for x in r.totals.as_array().into_iter().flatten() {
                let c = x["currency"].as_str().unwrap_or("");
                let m = |f: &str| reckon_audit_money(x[f].as_i64().unwrap_or(0), c);
                t.push_record([
                    c.to_ascii_uppercase(),
                    m("charged"),
                    m("refunded"),
                    m("net"),
                    m("matched"),
                    m("unmatched"),
                ]);
            }
            println!("{}", t.build());
            println!("digest {}", run.digest);
        }
    }
    Ok(())
}

fn reckon_audit_money(minor: i64, currency: &str) -> String {
    reckon_engine::audit::money(minor, currency)
}
