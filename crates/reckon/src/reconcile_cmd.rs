//! `reckon provider add|list`, `reckon route set|list`, `reckon reconcile`: the CLI of the
//! reconciler. The same checks as the API (`reckon_web::api::providers`).

use crate::Format;
use crate::output;
use anyhow::{Context, bail};
use clap::Subcommand;
use reckon_engine::commands;
use reckon_engine::connect::{self, Open};
use reckon_engine::provider_input::ProviderInput;
use reckon_engine::reconcile::{ReconcileCtx, ReconcileOptions, reconcile_all, reconcile_one};
use reckon_ledger::Ledger;
use std::io::Read;
use std::sync::Arc;

#[derive(Subcommand)]
pub enum ProviderCmd {
    /// Add a provider account. The secret is read from the environment variable named by
    /// --secret-env or from stdin (--secret-stdin), never from an argument (arguments
    /// show in `ps` and shell history).
    Add {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// The provider's name within the tenant (routes name it).
        #[arg(long)]
        name: String,
        /// stripe | http | demo
        #[arg(long)]
        kind: String,
        /// Name of an environment variable holding the secret (Stripe: a restricted
        /// read-only key; http: the auth header's value).
        #[arg(long, conflicts_with = "secret_stdin")]
        secret_env: Option<String>,
        /// Read the secret from stdin (one line).
        #[arg(long)]
        secret_stdin: bool,
        /// Settings as a JSON object, e.g. '{"base_url":"https://...","mode":"test"}'.
        #[arg(long)]
        settings: Option<String>,
    },
    /// The tenant's providers (never their secrets).
    List {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// How to print the list.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
}

#[derive(Subcommand)]
pub enum RouteCmd {
    /// Route an operation of a source (or `*`, every operation) to a provider, or to none.
    Set {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// The source's name.
        #[arg(long)]
        source: String,
        /// The operation (a key's first part, e.g. charge), or `*` for every operation.
        #[arg(long)]
        operation: String,
        /// The provider's name; omit with --none.
        #[arg(long, required_unless_present = "none")]
        provider: Option<String>,
        /// No provider can answer for this operation: its effects say "no provider".
        #[arg(long, conflicts_with = "provider")]
        none: bool,
    },
    /// The tenant's routes: which provider answers for which operation of which source.
    List {
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// How to print the list.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
}

pub async fn provider(
    ledger: &dyn Ledger,
    cmd: ProviderCmd,
    egress: &reckon_sources::EgressPolicy,
) -> anyhow::Result<()> {
    match cmd {
        ProviderCmd::Add {
            tenant,
            name,
            kind,
            secret_env,
            secret_stdin,
            settings,
        } => {
            let t = ledger.tenant_by_slug(&tenant).await?;
            let secret = if let Some(var) = secret_env {
                Some(std::env::var(&var).with_context(|| {
                    format!("environment variable {var} is not set (or not UTF-8)")
                })?)
            } else if secret_stdin {
                let mut text = String::new();
                std::io::stdin()
                    .read_to_string(&mut text)
                    .context("reading the secret from stdin")?;
                Some(text.trim_end_matches(['\r', '\n']).to_owned())
            } else {
                None
            };
            let settings = match settings {
                Some(s) => {
                    Some(serde_json::from_str(&s).context("--settings must be a JSON object")?)
                }
                None => None,
            };
            let input = ProviderInput {
                name,
                kind,
                secret: secret.map(secrecy::SecretString::from),
                settings,
            };
            let p = commands::add_provider(&crate::operator(ledger, egress, &t), input).await?;
            eprintln!("provider {} added ({})", p.name, p.kind);
        }
        ProviderCmd::List { tenant, format } => {
            let t = ledger.tenant_by_slug(&tenant).await?;
            let providers = ledger.list_providers(t.id).await?;
            output::rows(
                &providers,
                format,
                &["name", "kind", "has_secret", "settings", "calibration"],
                |p| {
                    vec![
                        p.name.clone(),
                        p.kind.to_string(),
                        p.has_secret.to_string(),
                        p.settings.to_string(),
                        calibration_words(p.calibration.as_ref()),
                    ]
                },
            )?;
        }
    }
    Ok(())
}

/// A provider's last calibration in one cell: its status, and why.
fn calibration_words(c: Option<&serde_json::Value>) -> String {
    match c {
        None => "not measured yet".into(),
        Some(c) => format!(
            "{}: {}",
            c["status"].as_str().unwrap_or("?"),
            c["reason"].as_str().unwrap_or("")
        ),
    }
}

pub async fn route(
    ledger: &dyn Ledger,
    cmd: RouteCmd,
    egress: &reckon_sources::EgressPolicy,
) -> anyhow::Result<()> {
    match cmd {
        RouteCmd::Set {
            tenant,
            source,
            operation,
            provider,
            none,
        } => {
            let t = ledger.tenant_by_slug(&tenant).await?;
            let provider = if none { None } else { provider };
            let ctx = crate::operator(ledger, egress, &t);
            let r = commands::set_route(&ctx, &source, &operation, provider.as_deref()).await?;
            eprintln!(
                "route {}/{} -> {}",
                r.source,
                r.operation,
                r.provider.as_deref().unwrap_or("none")
            );
        }
        RouteCmd::List { tenant, format } => {
            let t = ledger.tenant_by_slug(&tenant).await?;
            let routes = ledger.list_routes(t.id).await?;
            output::rows(&routes, format, &["source", "operation", "provider"], |r| {
                vec![
                    r.source.clone(),
                    r.operation.clone(),
                    r.provider.clone().unwrap_or_else(|| "none".into()),
                ]
            })?;
            say_unrouted(ledger, &t).await?;
        }
    }
    Ok(())
}

/// `reckon reconcile`: look up every due unresolved effect of the tenant (or of every
/// tenant), or one effect by source and key, now.
pub async fn reconcile(
    ledger: Arc<dyn Ledger>,
    tenant: Option<String>,
    source: Option<String>,
    key: Option<String>,
    format: Format,
    egress: Arc<reckon_sources::EgressPolicy>,
) -> anyhow::Result<()> {
    let ctx = ReconcileCtx {
        options: ReconcileOptions::default(),
        ..ReconcileCtx::new(ledger.clone()).with_egress(egress)
    };
    let tenants = match &tenant {
        Some(slug) => vec![ledger.tenant_by_slug(slug).await?],
        None => ledger.list_tenants().await?,
    };
    let mut outcomes = Vec::new();
    match (source, key) {
        (Some(source), Some(key)) => {
            let t = &tenants[0];
            let found = ledger
                .get_effect(t.id, &source, &key)
                .await?
                .with_context(|| format!("no effect with that key in source {source:?}"))?;
            match reconcile_one(&ctx, t, found.effect.id).await? {
                Some(o) => outcomes.push((t.slug.clone(), o)),
                None => bail!("the effect is resolved, or another worker holds it right now"),
            }
        }
        (None, None) => {
            for t in &tenants {
                for o in reconcile_all(&ctx, t).await? {
                    outcomes.push((t.slug.clone(), o));
                }
            }
        }
        _ => bail!("--source and --key go together"),
    }
    output::rows(
        &outcomes
            .iter()
            .map(|(t, o)| serde_json::json!({"tenant": t, "outcome": o}))
            .collect::<Vec<_>>(),
        format,
        &[
            "tenant", "source", "key", "provider", "outcome", "resolved", "reason",
        ],
        |v| {
            let o = &v["outcome"];
            let s = |f: &str| match &o[f] {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Null => String::new(),
                other => other.to_string(),
            };
            vec![
                v["tenant"].as_str().unwrap_or_default().to_owned(),
                s("source"),
                s("key"),
                s("provider"),
                s("outcome"),
                s("resolved"),
                s("reason"),
            ]
        },
    )?;
    let resolved = outcomes.iter().filter(|(_, o)| o.resolved).count();
    // What is still open is counted from the ledger, not from this run's lookups: effects
    // never looked up (no route) and effects parked for a person are open too.
    let now = reckon_domain::time::now();
    let mut open = Open::default();
    let mut gaps = Vec::new();
    for t in &tenants {
        let backlog = ledger.unresolved_by_operation(t.id, now).await?;
        let routes = ledger.list_routes(t.id).await?;
        let o = Open::of(&backlog, &routes);
        open.unrouted += o.unrouted;
        open.routed_to_none += o.routed_to_none;
        open.needs_a_person += o.needs_a_person;
        open.provisional += o.provisional;
        open.waiting += o.waiting;
        let providers = ledger.list_providers(t.id).await?;
        let first = providers.first().map(|p| p.name.clone());
        for g in connect::unrouted(&backlog, &routes) {
            gaps.push(g.sentence(&t.slug, first.as_deref()));
        }
    }
    let asked = outcomes
        .iter()
        .filter(|(_, o)| o.provider.is_some())
        .count();
    eprintln!(
        "{} due now: {asked} asked a provider, {resolved} resolved; {}",
        outcomes.len(),
        open.sentence()
    );
    for g in gaps {
        eprintln!("{g}");
    }
    Ok(())
}

/// After a listing of sources: each operation with open effects that no provider is routed
/// for, with the command that routes it (nothing when every one is routed).
pub async fn say_unrouted(ledger: &dyn Ledger, t: &reckon_ledger::Tenant) -> anyhow::Result<()> {
    let backlog = ledger
        .unresolved_by_operation(t.id, reckon_domain::time::now())
        .await?;
    let routes = ledger.list_routes(t.id).await?;
    let providers = ledger.list_providers(t.id).await?;
    let first = providers.first().map(|p| p.name.as_str());
    for g in connect::unrouted(&backlog, &routes) {
        eprintln!("{}", g.sentence(&t.slug, first));
    }
    Ok(())
}
