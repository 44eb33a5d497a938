//! The `reckon` binary: CLI, configuration, wiring. Everything it does is a call into the
//! library crates; see ARCHITECTURE.md for the map.

// audit (issue 6, branch `audit`)
mod audit_cmd;
mod config;
mod demo;
mod healthcheck;
mod keys;
mod logging;
mod lookup_cmd;
mod output;
mod reconcile_cmd;
mod serve;
mod users;
// write-back (issue 4 item 7)
mod writeback;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use config::{Overrides, Settings};
use reckon_engine::{ScanOptions, SourceInput, new_source, scan_source};
use reckon_ledger::{Keyring, Ledger, Role};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "reckon",
    version,
    about = "Find out what really happened to every side effect."
)]
struct Cli {
    /// Configuration file (optional).
    #[arg(long, global = true, default_value = "reckon.toml")]
    config: PathBuf,
    /// Data directory for the embedded ledger (RECKON_DATA_DIR).
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// Ledger URL (RECKON_DATABASE_URL); postgres://... selects PostgreSQL.
    #[arg(long, global = true)]
    database_url: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    Table,
    Json,
    Csv,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the HTTP server and the scheduled scans.
    Serve {
        /// Listen address (RECKON_LISTEN), default 127.0.0.1:8080.
        #[arg(long)]
        listen: Option<String>,
    },
    /// Everything on an embedded ledger, a generated justonce store, in one command.
    Demo {
        #[arg(long, default_value_t = 7)]
        seed: u64,
        #[arg(long)]
        listen: Option<String>,
    },
    /// Apply the ledger's migrations.
    Migrate,
    /// Probe a running reckon's /healthz (exit 0 when healthy): the container health check.
    Healthcheck {
        #[arg(long, default_value = "http://127.0.0.1:8080/healthz")]
        url: String,
    },
    Tenant {
        #[command(subcommand)]
        cmd: TenantCmd,
    },
    Token {
        #[command(subcommand)]
        cmd: TokenCmd,
    },
    Source {
        #[command(subcommand)]
        cmd: SourceCmd,
    },
    /// People who sign in to the dashboard, and their role per tenant.
    User {
        #[command(subcommand)]
        cmd: users::UserCmd,
    },
    /// The master key that seals stored secrets.
    Keys {
        #[command(subcommand)]
        cmd: keys::KeysCmd,
    },
    // ---- reconciliation (issue 4) ----
    /// Provider accounts that can say whether an effect happened.
    Provider {
        #[command(subcommand)]
        cmd: reconcile_cmd::ProviderCmd,
    },
    /// Which provider answers for which operation of a source.
    Route {
        #[command(subcommand)]
        cmd: reconcile_cmd::RouteCmd,
    },
    /// Look up due unresolved effects now (every tenant's, one tenant's, or one effect).
    Reconcile {
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long, requires_all = ["tenant", "key"])]
        source: Option<String>,
        #[arg(long, requires = "source")]
        key: Option<String>,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    // ---- end reconciliation ----
    // ---- audit (issue 6, branch `audit`) ----
    /// The double-charge audit of a day: run it (default yesterday in the tenant's zone),
    /// show, list and verify stored runs, set the tenant's zone and nightly time.
    Audit(audit_cmd::AuditArgs),
    // ---- write-back (issue 4 item 7, branch `writeback`) ----
    /// Write resolutions back into the rows of sources that opted in (`--dry-run` shows
    /// the diff); `set` turns a source's write-back on or off; `list` shows the log.
    Writeback(writeback::WritebackArgs),
    // ---- end write-back ----
    /// What happened to an order: reckon's verdict per effect, with the audit's findings
    /// and the provider's charges. Finds by whole key, key part (an order id) or provider
    /// object id (ch_…, pi_…, re_…). Exits 1 when nothing is found.
    Lookup {
        /// The tenant whose effects to search.
        #[arg(long)]
        tenant: String,
        /// An order id, a key part, a whole key or a provider object id.
        text: String,
        /// How to print the answer: a table with the sentence, JSON, or CSV (one row per
        /// effect and per charge with no effect).
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
}

#[derive(Subcommand)]
enum TenantCmd {
    Create { slug: String },
    List,
}

#[derive(Subcommand)]
enum TokenCmd {
    /// Print a new API token once, alone on stdout.
    Create {
        #[arg(long)]
        tenant: String,
        #[arg(long, default_value = "viewer")]
        role: String,
        #[arg(long, default_value = "cli")]
        label: String,
    },
    /// The tenant's tokens (never the tokens themselves), one JSON object a line.
    List {
        #[arg(long)]
        tenant: String,
    },
    /// Revoke a token by id: refused from its next request on, on every replica.
    Revoke {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        id: i64,
    },
}

#[derive(Subcommand)]
enum SourceCmd {
    Add {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        name: String,
        /// sqlite | postgres | mysql | push
        #[arg(long)]
        kind: String,
        #[arg(long)]
        dsn: Option<String>,
        #[arg(long)]
        table: Option<String>,
        /// e.g. 60s
        #[arg(long)]
        scan_interval: Option<String>,
        /// Grace after a lease ends before a claim is abandoned, e.g. 5m.
        #[arg(long)]
        abandoned_after: Option<String>,
        /// How far back each incremental scan re-reads, e.g. 60s.
        #[arg(long)]
        overlap: Option<String>,
        /// How often key sets are compared to notice deleted rows, e.g. 1h.
        #[arg(long)]
        full_scan_every: Option<String>,
    },
    List {
        #[arg(long)]
        tenant: String,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Scan one source, or every scanned source.
    Scan {
        #[arg(long, requires = "name")]
        tenant: Option<String>,
        #[arg(long, requires = "tenant")]
        name: Option<String>,
        /// Also compare key sets now (notices swept and released rows).
        #[arg(long)]
        full: bool,
    },
}

pub async fn open_ledger(settings: &Settings) -> anyhow::Result<Arc<dyn Ledger>> {
    let url = settings.database_url.as_deref();
    let dir = &settings.data_dir;
    if let Some(k) = &settings.master_key {
        let keyring = Keyring::from_base64(k).context("reading RECKON_MASTER_KEY")?;
        return reckon_ledger::connect(url, dir, keyring)
            .await
            .context("opening the ledger");
    }
    // The embedded default: a key file in the data directory. It is written only once a
    // ledger has accepted the key, so a lost file is never silently replaced by a new key
    // (the ledger's check value refuses it: see reckon-ledger keys.rs).
    let path = dir.join(keys::KEY_FILE);
    let pending = dir.join(keys::PENDING_KEY_FILE);
    match Keyring::load_file(&path).context("loading the master key file")? {
        Some(keyring) => match reckon_ledger::connect(url, dir, keyring).await {
            // A rotation committed its new key but stopped before the file was switched.
            Err(reckon_ledger::LedgerError::WrongMasterKey) if pending.exists() => {
                let next = Keyring::load_file(&pending)?.context("reading master.key.new")?;
                let ledger = reckon_ledger::connect(url, dir, next)
                    .await
                    .context("opening the ledger with master.key.new")?;
                std::fs::rename(&pending, &path).context("finishing a key rotation")?;
                tracing::warn!(
                    "finished an interrupted key rotation: master.key.new is now master.key"
                );
                Ok(ledger)
            }
            other => other.context("opening the ledger"),
        },
        None => {
            let key = Keyring::generate_base64();
            let ledger = reckon_ledger::connect(url, dir, Keyring::from_base64(&key)?)
                .await
                .context("opening the ledger (no master key file: a new ledger needs none)")?;
            Keyring::write_file(&path, &key).context("saving the new master key")?;
            Ok(ledger)
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    logging::init()?;
    let cli = Cli::parse();
    let listen = match &cli.cmd {
        Cmd::Serve { listen } | Cmd::Demo { listen, .. } => listen.clone(),
        _ => None,
    };
    let settings = Settings::load(
        &cli.config,
        Overrides {
            data_dir: cli.data_dir.clone(),
            database_url: cli.database_url.clone(),
            listen,
        },
    )?;

    match cli.cmd {
        Cmd::Healthcheck { url } => return healthcheck::run(&url).await,
        Cmd::Keys {
            cmd: keys::KeysCmd::Generate,
        } => {
            println!("{}", Keyring::generate_base64());
            return Ok(());
        }
        Cmd::Demo { seed, .. } => return demo::run(settings, seed).await,
        Cmd::Serve { .. } => {
            let ledger = open_ledger(&settings).await?;
            return serve::run(settings, ledger, None).await;
        }
        _ => {}
    }
    let ledger = open_ledger(&settings).await?;
    match cli.cmd {
        Cmd::Serve { .. } | Cmd::Demo { .. } | Cmd::Healthcheck { .. } => {
            unreachable!("handled above")
        }
        Cmd::Migrate => {
            ledger.migrate().await?;
            eprintln!("ledger migrated");
        }
        Cmd::Tenant { cmd } => match cmd {
            TenantCmd::Create { slug } => {
                let t = ledger.create_tenant(&slug).await?;
                eprintln!("tenant {} created", t.slug);
            }
            TenantCmd::List => {
                for t in ledger.list_tenants().await? {
                    println!("{}", t.slug);
                }
            }
        },
        Cmd::Token { cmd } => match cmd {
            TokenCmd::Create {
                tenant,
                role,
                label,
            } => {
                let role = Role::parse(&role).with_context(|| {
                    format!("role {role:?} is not one of viewer, support, finance, admin")
                })?;
                let t = ledger.tenant_by_slug(&tenant).await?;
                let (token, hash) = reckon_web::mint_token();
                ledger.create_token(t.id, role, &hash, &label).await?;
                // Alone on stdout so a script can capture it; it is shown only this once.
                println!("{token}");
            }
            TokenCmd::List { tenant } => users::list_tokens(&*ledger, &tenant).await?,
            TokenCmd::Revoke { tenant, id } => users::revoke_token(&*ledger, &tenant, id).await?,
        },
        Cmd::User { cmd } => users::run(&*ledger, cmd).await?,
        // audit (issue 6)
        Cmd::Audit(args) => {
            let egress = Arc::new(settings.egress_policy(&*ledger).await?);
            audit_cmd::run(ledger.clone(), args, egress).await?
        }
        Cmd::Source { cmd } => {
            source_cmd(&*ledger, cmd, settings.egress_policy(&*ledger).await?).await?
        }
        Cmd::Keys { cmd } => keys::run(&*ledger, cmd, &settings).await?,
        Cmd::Provider { cmd } => {
            reconcile_cmd::provider(&*ledger, cmd, &settings.egress_policy(&*ledger).await?).await?
        }
        Cmd::Route { cmd } => reconcile_cmd::route(&*ledger, cmd).await?,
        Cmd::Reconcile {
            tenant,
            source,
            key,
            format,
        } => {
            let egress = Arc::new(settings.egress_policy(&*ledger).await?);
            reconcile_cmd::reconcile(ledger, tenant, source, key, format, egress).await?
        }
        // write-back (issue 4 item 7)
        Cmd::Writeback(args) => {
            writeback::run(
                ledger.clone(),
                args,
                settings.egress_policy(&*ledger).await?,
            )
            .await?
        }
        Cmd::Lookup {
            tenant,
            text,
            format,
        } => {
            if !lookup_cmd::lookup(&*ledger, &tenant, &text, format).await? {
                // Nothing found is an answer (printed above), and exit status 1 for scripts.
                std::process::exit(1);
            }
        }
    }
    Ok(())
}

async fn source_cmd(
    ledger: &dyn Ledger,
    cmd: SourceCmd,
    egress: reckon_sources::EgressPolicy,
) -> anyhow::Result<()> {
    match cmd {
        SourceCmd::Add {
            tenant,
            name,
            kind,
            dsn,
            table,
            scan_interval,
            abandoned_after,
            overlap,
            full_scan_every,
        } => {
            let t = ledger.tenant_by_slug(&tenant).await?;
            let new = new_source(SourceInput {
                name,
                kind,
                dsn,
                table,
                scan_interval,
                abandoned_after,
                overlap,
                full_scan_every,
            })
            .map_err(anyhow::Error::msg)?;
            reckon_engine::check_dsn_at_save(new.kind, new.dsn.as_ref(), &egress, &t.slug)
                .await
                .map_err(anyhow::Error::msg)?;
            let s = ledger.add_source(t.id, new).await?;
            eprintln!("source {} added ({})", s.name, s.kind.as_str());
        }
        SourceCmd::List { tenant, format } => {
            let t = ledger.tenant_by_slug(&tenant).await?;
            output::sources(&ledger.list_sources(t.id).await?, format)?;
        }
        SourceCmd::Scan { tenant, name, full } => {
            let targets = match (tenant, name) {
                (Some(t), Some(n)) => {
                    let t = ledger.tenant_by_slug(&t).await?;
                    let s = ledger.source_by_name(t.id, &n).await?;
                    if !s.kind.is_scanned() {
                        bail!("source {n:?} is a push source: nothing to scan");
                    }
                    vec![(t, s)]
                }
                _ => ledger.all_scanned_sources().await?,
            };
            let mut failed = 0;
            for (t, s) in targets {
                let bar = output::progress(&format!("{}/{}", t.slug, s.name));
                let b = bar.clone();
                let opts = ScanOptions {
                    full,
                    egress: Arc::new(egress.clone()),
                    progress: Some(Arc::new(move |n| b.set_position(n))),
                    ..Default::default()
                };
                let result = scan_source(ledger, &t, &s, &opts).await;
                bar.finish_and_clear();
                match result {
                    Ok(r) => println!(
                        "{}/{}: read {} rows: {} created, {} updated, {} unchanged, {} stale, {} quarantined{}{}",
                        t.slug,
                        s.name,
                        r.rows_read,
                        r.created,
                        r.updated,
                        r.unchanged,
                        r.stale,
                        r.quarantined,
                        if r.full {
                            format!("; key sets compared: {} gone", r.gone.len())
                        } else {
                            String::new()
                        },
                        if r.recovered > 0 {
                            format!(", {} recovered", r.recovered)
                        } else {
                            String::new()
                        }
                    ),
                    Err(e) => {
                        failed += 1;
                        eprintln!("{}/{}: scan failed: {e}", t.slug, s.name);
                    }
                }
            }
            if failed > 0 {
                bail!("{failed} source scan(s) failed");
            }
        }
    }
    Ok(())
}
