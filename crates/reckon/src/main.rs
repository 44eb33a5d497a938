//! The `reckon` binary: CLI, configuration, wiring. Everything it does is a call into the
//! library crates; see ARCHITECTURE.md for the map.

mod audit_cmd;
mod config;
mod demo;
mod healthcheck;
mod keys;
mod logging;
mod lookup_cmd;
mod migrating;
mod output;
mod reconcile_cmd;
mod serve;
mod users;
mod writeback;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use config::{Overrides, Settings};
use reckon_engine::commands;
use reckon_engine::schedule::{Claimed, SCAN_LEASE_SECS, ScanScheduler};
use reckon_engine::{ScanOptions, SourceInput};
use reckon_ledger::{Keyring, Ledger};
use secrecy::ExposeSecret;
use std::path::PathBuf;
use std::sync::Arc;

/// How the audit log names whoever runs the CLI: the operator, who holds the ledger.
const OPERATOR: &str = "operator";

/// A command made from the CLI: by the operator, who holds the ledger's keys.
pub(crate) fn operator<'a>(
    ledger: &'a dyn Ledger,
    egress: &'a reckon_sources::EgressPolicy,
    tenant: &'a reckon_ledger::Tenant,
) -> commands::Ctx<'a> {
    commands::Ctx {
        ledger,
        egress,
        tenant,
        actor: OPERATOR.into(),
        via: commands::Via::Cli,
    }
}
#[derive(Parser)]
#[command(
    name = "reckon",
    version,
    about = "Find out what really happened to every side effect."
)]
struct Cli {
    /// Configuration file (read when it exists; its settings lose to RECKON_* variables
    /// and to flags).
    #[arg(long, global = true, default_value = "reckon.toml")]
    config: PathBuf,
    /// Data directory of the embedded ledger and its master key file (RECKON_DATA_DIR,
    /// default ./reckon-data).
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// Ledger URL (RECKON_DATABASE_URL); postgres://... selects PostgreSQL, unset is the
    /// SQLite file reckon.db in the data directory.
    #[arg(long, global = true)]
    database_url: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

/// How a command prints what it lists.
#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    /// Aligned columns for people, times as "01 Dec 2026 19:40 CET" (the tenant's zone).
    Table,
    /// The records as JSON, times as epoch seconds.
    Json,
    /// One row per record with a header line; cells a spreadsheet would run as a formula
    /// start with a quote.
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
    ///
    /// Its ledger, key file and reckon.toml go to --data-dir (or RECKON_DATA_DIR) when one
    /// is given, which must not hold a ledger yet, else to a new temporary directory. The
    /// banner prints the command prefix that points the CLI at that ledger.
    Demo {
        /// Seed of the generated day of charges (the same seed writes the same rows).
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// Listen address of the demo's server (default RECKON_LISTEN, 127.0.0.1:8080;
        /// port 0 picks a free one).
        #[arg(long)]
        listen: Option<String>,
        /// Keep the demo's temporary data directory when it stops (it is removed
        /// otherwise). A directory given with --data-dir is always kept.
        #[arg(long)]
        keep: bool,
    },
    /// Create the ledger if it does not exist, and apply its migrations.
    Migrate,
    /// Probe a running reckon's /healthz (exit 0 when healthy): the container health check.
    Healthcheck {
        /// The health URL to probe.
        #[arg(long, default_value = "http://127.0.0.1:8080/healthz")]
        url: String,
    },
    /// Tenants: the organisations whose data reckon keeps apart.
    Tenant {
        #[command(subcommand)]
        cmd: TenantCmd,
    },
    /// API tokens of a tenant: create (shown once), list, revoke.
    Token {
        #[command(subcommand)]
        cmd: TokenCmd,
    },
    /// Sources: the justonce stores reckon reads (add, check, list, scan now).
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
        /// Only this tenant's effects (default: every tenant's).
        #[arg(long)]
        tenant: Option<String>,
        /// With --key: the source of the one effect to look up now.
        #[arg(long, requires_all = ["tenant", "key"])]
        source: Option<String>,
        /// With --source: the key of the one effect to look up now, even if not due.
        #[arg(long, requires = "source")]
        key: Option<String>,
        /// How to print the outcomes.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// The double-charge audit of a day: run it (default yesterday in the tenant's zone),
    /// show, list and verify stored runs, set the tenant's zone and nightly time.
    Audit(audit_cmd::AuditArgs),
    /// Write resolutions back into the rows of sources that opted in (`--dry-run` shows
    /// the diff); `set` turns a source's write-back on or off; `list` shows the log.
    Writeback(writeback::WritebackArgs),
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
    /// Create a tenant (and the ledger, if there is none yet).
    Create {
        /// The tenant's short name, used in URLs and on the command line.
        slug: String,
    },
    /// Every tenant.
    List {
        /// How to print the list.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
}

#[derive(Subcommand)]
enum TokenCmd {
    /// Print a new API token once, alone on stdout.
    Create {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// viewer | support | finance | admin
        #[arg(long, default_value = "viewer")]
        role: String,
        /// A name to recognise the token by in lists.
        #[arg(long, default_value = "cli")]
        label: String,
    },
    /// The tenant's tokens (never the tokens themselves).
    List {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// How to print the list.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Revoke a token by id: refused from its next request on, on every replica.
    Revoke {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// The token's id, from `reckon token list`.
        #[arg(long)]
        id: i64,
    },
}

#[derive(Subcommand)]
enum SourceCmd {
    /// Add a source: a justonce table to scan, or a push source fed through the API.
    Add {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// The source's name within the tenant.
        #[arg(long)]
        name: String,
        /// sqlite | postgres | mysql | push | mapped (a table read through --mapping, in
        /// the DSN's dialect)
        #[arg(long)]
        kind: String,
        /// Where the store is: an absolute file path (sqlite) or a URL (postgres://...,
        /// mysql://...); only sslmode / ssl-mode parameters. Stored sealed.
        #[arg(long)]
        dsn: Option<String>,
        /// The table to read (default justonce_keys).
        #[arg(long)]
        table: Option<String>,
        /// A table that is not justonce's: a preset (justonce, brandur) or the mapping's
        /// JSON settings (docs/mapped-sources.md). Checked against the live table.
        #[arg(long)]
        mapping: Option<String>,
        /// How often `reckon serve` scans it, e.g. 60s.
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
    /// Change a source's settings: only the flags given change, checked as `add` checks
    /// them. A DSN without a password keeps the stored one while it points where the
    /// password already went (same host, port, user, database, and transport no weaker);
    /// a new password comes from --password-env or --password-stdin, never an argument.
    /// The name and the kind stay.
    Edit {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// The source's name.
        #[arg(long)]
        name: String,
        /// A new location: an absolute file path (sqlite) or a URL (postgres://...,
        /// mysql://...). Stored sealed, never printed.
        #[arg(long)]
        dsn: Option<String>,
        /// Name of an environment variable holding a new password (postgres, mysql).
        #[arg(long, conflicts_with = "password_stdin")]
        password_env: Option<String>,
        /// Read a new password from stdin (one line).
        #[arg(long)]
        password_stdin: bool,
        /// The table to read.
        #[arg(long)]
        table: Option<String>,
        /// How often `reckon serve` scans it, e.g. 60s.
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
    /// The tenant's sources with their health (last success, last error, failures).
    List {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// How to print the list.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Check a source as the connect flow does: connection, table and columns, row count,
    /// scanned, unknowns and abandoned claims found, operations with no provider routed;
    /// each failed check prints the command that fixes it. Exits 1 when one fails.
    Check {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// The source's name.
        #[arg(long)]
        name: String,
    },
    /// Scan one source, or every scanned source.
    Scan {
        /// With --name: the tenant of the one source to scan.
        #[arg(long, requires = "name")]
        tenant: Option<String>,
        /// With --tenant: the one source to scan.
        #[arg(long, requires = "tenant")]
        name: Option<String>,
        /// Also compare key sets now (notices swept and released rows).
        #[arg(long)]
        full: bool,
    },
}

/// Whether a command may bring a ledger into being. Only the commands meant to set one up
/// (`migrate`, `serve`, `demo`, `tenant create`) create the SQLite file and its key file;
/// every other command opens an existing ledger or fails naming where it looked, so a
/// mistyped `--data-dir` never leaves an empty ledger and a stray key file behind.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Access {
    Create,
    Existing,
}

/// The SQLite file the settings name, if the ledger is an embedded one (`None` for
/// PostgreSQL, and for an in-memory SQLite URL, which has no file).
fn sqlite_file(settings: &Settings) -> anyhow::Result<Option<PathBuf>> {
    match settings
        .database_url
        .as_ref()
        .map(ExposeSecret::expose_secret)
    {
        None => Ok(Some(settings.data_dir.join("reckon.db"))),
        Some(u) if u.starts_with("sqlite:") => {
            let opts = <sqlx::sqlite::SqliteConnectOptions as std::str::FromStr>::from_str(u)
                .with_context(|| format!("reading the ledger URL {u:?}"))?;
            let file = opts.get_filename();
            let name = file.to_string_lossy();
            Ok((!name.is_empty() && !name.contains(":memory:")).then(|| file.to_path_buf()))
        }
        Some(_) => Ok(None),
    }
}

pub async fn open_ledger(settings: &Settings, access: Access) -> anyhow::Result<Arc<dyn Ledger>> {
    let url = settings
        .database_url
        .as_ref()
        .map(ExposeSecret::expose_secret);
    let dir = &settings.data_dir;
    if access == Access::Existing
        && let Some(file) = sqlite_file(settings)?
        && !file.exists()
    {
        bail!(
            "no ledger at {}: point the CLI at an existing one (--data-dir, RECKON_DATA_DIR, \
             --database-url, or --config naming a reckon.toml that sets them), or create one \
             with `reckon migrate`",
            file.display()
        );
    }
    if let Some(k) = &settings.master_key {
        let keyring =
            Keyring::from_base64(k.expose_secret()).context("reading RECKON_MASTER_KEY")?;
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
        None if access == Access::Existing => bail!(
            "the master key does not open this ledger: {} is missing and RECKON_MASTER_KEY is \
             unset (the ledger's secrets are sealed with its own key; a new one cannot replace it)",
            path.display()
        ),
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

/// Errors end the process with one line on stderr (the whole `anyhow` chain, no
/// backtrace) and exit status 1; clap's own usage errors exit 2.
/// mimalloc rather than the system allocator: a scan allocates a few strings per row, and
/// glibc's malloc and free were a third of reckon's CPU in a first scan (7 % of its time).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    if let Err(e) = logging::init() {
        eprintln!("error: {e:#}");
        return std::process::ExitCode::FAILURE;
    }
    match run(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let listen = match &cli.cmd {
        Cmd::Serve { listen } | Cmd::Demo { listen, .. } => listen.clone(),
        _ => None,
    };
    let overrides = Overrides {
        data_dir: cli.data_dir.clone(),
        database_url: cli.database_url.clone(),
        listen,
    };
    let data_dir_given = config::data_dir_given(&cli.config, &overrides);
    let settings = Settings::load(&cli.config, overrides)?;
    // Every command that asks a provider (serve, reconcile, audit, lookup) reads within it.
    reckon_providers::client::set_max_answer_bytes(settings.max_provider_answer_bytes);

    match cli.cmd {
        Cmd::Healthcheck { url } => return healthcheck::run(&url).await,
        Cmd::Keys {
            cmd: keys::KeysCmd::Generate,
        } => {
            println!("{}", Keyring::generate_base64());
            return Ok(());
        }
        Cmd::Demo { seed, keep, .. } => {
            let dir = data_dir_given.then(|| settings.data_dir.clone());
            return demo::run(settings, seed, dir, keep).await;
        }
        Cmd::Serve { .. } => {
            let opening = open_ledger(&settings, Access::Create);
            let ledger = migrating::answering(&settings.listen, opening).await?;
            return serve::run(settings, ledger, None).await;
        }
        _ => {}
    }
    let access = match &cli.cmd {
        Cmd::Migrate
        | Cmd::Tenant {
            cmd: TenantCmd::Create { .. },
        } => Access::Create,
        _ => Access::Existing,
    };
    let ledger = match cli.cmd {
        Cmd::Migrate => migrating::logged(open_ledger(&settings, access)).await?,
        _ => open_ledger(&settings, access).await?,
    };
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
            TenantCmd::List { format } => {
                output::rows(
                    &ledger.list_tenants().await?,
                    format,
                    &["slug", "created_at"],
                    // No one tenant's zone: UTC.
                    |t| {
                        vec![
                            t.slug.clone(),
                            output::when(t.created_at, &jiff::tz::TimeZone::UTC),
                        ]
                    },
                )?;
            }
        },
        Cmd::Token { cmd } => match cmd {
            TokenCmd::Create {
                tenant,
                role,
                label,
            } => {
                let t = ledger.tenant_by_slug(&tenant).await?;
                let egress = settings.egress_policy(&*ledger).await?;
                let (token, hash) = reckon_web::mint_token();
                let request = commands::TokenRequest {
                    role: &role,
                    label: &label,
                    creator: reckon_ledger::TokenCreator::Operator,
                    ceiling: None,
                    hash: &hash,
                };
                commands::create_token(&operator(&*ledger, &egress, &t), request).await?;
                // Alone on stdout so a script can capture it; it is shown only this once.
                println!("{token}");
            }
            TokenCmd::List { tenant, format } => {
                users::list_tokens(&*ledger, &tenant, format).await?;
            }
            TokenCmd::Revoke { tenant, id } => {
                let t = ledger.tenant_by_slug(&tenant).await?;
                let egress = settings.egress_policy(&*ledger).await?;
                commands::revoke_token(&operator(&*ledger, &egress, &t), id).await?;
                eprintln!("token {id} revoked");
            }
        },
        Cmd::User { cmd } => {
            let egress = settings.egress_policy(&*ledger).await?;
            users::run(&*ledger, &egress, cmd).await?;
        }
        Cmd::Audit(args) => {
            let egress = Arc::new(settings.egress_policy(&*ledger).await?);
            audit_cmd::run(ledger.clone(), args, egress).await?;
        }
        Cmd::Source { cmd } => {
            source_cmd(&ledger, cmd, settings.egress_policy(&*ledger).await?).await?;
        }
        Cmd::Keys { cmd } => keys::run(&*ledger, cmd, &settings).await?,
        Cmd::Provider { cmd } => {
            reconcile_cmd::provider(&*ledger, cmd, &settings.egress_policy(&*ledger).await?)
                .await?;
        }
        Cmd::Route { cmd } => {
            reconcile_cmd::route(&*ledger, cmd, &settings.egress_policy(&*ledger).await?).await?;
        }
        Cmd::Reconcile {
            tenant,
            source,
            key,
            format,
        } => {
            let egress = Arc::new(settings.egress_policy(&*ledger).await?);
            reconcile_cmd::reconcile(ledger, tenant, source, key, format, egress).await?;
        }
        Cmd::Writeback(args) => {
            writeback::run(
                ledger.clone(),
                args,
                settings.egress_policy(&*ledger).await?,
            )
            .await?;
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

/// How long `reckon source scan` waits for another process's scan of the same source.
const CLI_SCAN_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

async fn source_cmd(
    ledger: &Arc<dyn Ledger>,
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
            mapping,
            scan_interval,
            abandoned_after,
            overlap,
            full_scan_every,
        } => {
            let t = ledger.tenant_by_slug(&tenant).await?;
            let ctx = operator(&**ledger, &egress, &t);
            let input = SourceInput {
                name,
                kind,
                dsn,
                table,
                scan_interval,
                abandoned_after,
                overlap,
                full_scan_every,
                mapping,
            };
            let (s, checked) = commands::add_source_checked(&ctx, input).await?;
            eprintln!("source {} added ({})", s.name, s.kind.as_str());
            if let Some(c) = checked {
                eprintln!("mapping checked against {c}");
            }
            // Checked at once, so what is still missing (a setting, a scan, a route) is said
            // with its fix now; the source stays added whatever the checks say.
            let now = reckon_domain::time::now();
            let checks =
                reckon_engine::connect::check_source(&**ledger, &t, &s, &egress, now).await?;
            output::checks(&s.name, &checks);
        }
        SourceCmd::Edit {
            tenant,
            name,
            dsn,
            password_env,
            password_stdin,
            table,
            scan_interval,
            abandoned_after,
            overlap,
            full_scan_every,
        } => {
            let t = ledger.tenant_by_slug(&tenant).await?;
            let password = if let Some(var) = password_env {
                Some(std::env::var(&var).with_context(|| {
                    format!("environment variable {var} is not set (or not UTF-8)")
                })?)
            } else if password_stdin {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                    .context("reading the password from stdin")?;
                Some(text.trim_end_matches(['\r', '\n']).to_owned())
            } else {
                None
            };
            let edit = reckon_engine::SourceEdit {
                dsn,
                password,
                table,
                scan_interval,
                abandoned_after,
                overlap,
                full_scan_every,
            };
            let fields = edit.fields().join(", ");
            let ctx = operator(&**ledger, &egress, &t);
            let s = commands::edit_source(&ctx, &name, edit).await?;
            // The names of what changed, never a value: a DSN may carry its password.
            eprintln!("source {} changed: {fields}", s.name);
            let now = reckon_domain::time::now();
            let checks =
                reckon_engine::connect::check_source(&**ledger, &t, &s, &egress, now).await?;
            output::checks(&s.name, &checks);
        }
        SourceCmd::Check { tenant, name } => {
            let t = ledger.tenant_by_slug(&tenant).await?;
            let s = ledger.source_by_name(t.id, &name).await?;
            let now = reckon_domain::time::now();
            let checks =
                reckon_engine::connect::check_source(&**ledger, &t, &s, &egress, now).await?;
            if !output::checks(&s.name, &checks) {
                bail!("source {name}: a check failed; its fix is printed above");
            }
        }
        SourceCmd::List { tenant, format } => {
            let t = ledger.tenant_by_slug(&tenant).await?;
            let tz = output::tenant_zone(&**ledger, t.id).await?;
            output::sources(&ledger.list_sources(t.id).await?, format, &tz)?;
            reconcile_cmd::say_unrouted(&**ledger, &t).await?;
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
            // The scheduler's own lease per source: a scan `reckon serve` (or another
            // operator) is running now is left to it.
            let scans = ScanScheduler::new(
                ledger.clone(),
                format!("cli-{}", std::process::id()),
                reckon_web::metrics::Metrics::new(),
                Arc::new(egress.clone()),
            );
            for (t, s) in targets {
                let bar = output::progress(&format!("{}/{}", t.slug, s.name));
                let b = bar.clone();
                let opts = ScanOptions {
                    full,
                    progress: Some(Arc::new(move |n| b.set_position(n))),
                    ..Default::default()
                };
                let (slug, name) = (t.slug.clone(), s.name.clone());
                // A scan another process runs now is waited for, then this one runs: a
                // replica's scan ends and hands its lease back, and a process that died
                // lets it go as it dies (a paused one, within the lease's term).
                let until = std::time::Instant::now() + CLI_SCAN_WAIT;
                let mut waiting = false;
                let result = loop {
                    match scans.scan_now(t.clone(), s.clone(), opts.clone()).await {
                        Claimed::NotOurs if std::time::Instant::now() < until => {
                            if !waiting {
                                bar.suspend(|| {
                                    eprintln!(
                                        "{slug}/{name}: another process is scanning it now; \
                                         waiting for that scan to end (a process that stopped \
                                         answering frees it within {SCAN_LEASE_SECS:.0} s)"
                                    );
                                });
                                waiting = true;
                            }
                            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                        }
                        other => break other,
                    }
                };
                bar.finish_and_clear();
                match result {
                    Claimed::Scanned(r) => println!(
                        "{slug}/{name}: read {} rows: {} created, {} updated, {} unchanged, {} stale, {} quarantined{}{}",
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
                    Claimed::NotOurs => {
                        failed += 1;
                        eprintln!(
                            "{slug}/{name}: another process has been scanning it for {} s; \
                             try again when that scan has finished",
                            CLI_SCAN_WAIT.as_secs()
                        );
                    }
                    Claimed::Failed(e) => {
                        failed += 1;
                        eprintln!("{slug}/{name}: scan failed: {e}");
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

#[cfg(test)]
mod help_tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every command and every option says what it is for in `--help`: an option added
    /// without a doc comment fails here.
    #[test]
    fn every_command_and_option_has_help_text() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            if cmd.get_about().is_none() && cmd.get_long_about().is_none() {
                missing.push(format!("command `{path}`"));
            }
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let empty = |h: Option<&clap::builder::StyledStr>| {
                    h.is_none_or(|h| h.to_string().trim().is_empty())
                };
                if empty(arg.get_help()) && empty(arg.get_long_help()) {
                    missing.push(format!("option `{id}` of `{path}`"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_name() == "help" {
                    continue;
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let root = Cli::command();
        root.clone().debug_assert();
        let mut missing = Vec::new();
        walk(&root, "reckon", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
        // The walk reached the nested commands (not only the top level).
        let mut names = Vec::new();
        fn collect(cmd: &clap::Command, names: &mut Vec<String>) {
            for sub in cmd.get_subcommands() {
                names.push(sub.get_name().to_owned());
                collect(sub, names);
            }
        }
        collect(&root, &mut names);
        for n in ["tenant", "token", "source", "scan", "revoke", "settings"] {
            assert!(names.iter().any(|x| x == n), "{n} not walked");
        }
    }
}
