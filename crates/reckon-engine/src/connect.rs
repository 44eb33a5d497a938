//! Connecting a justonce store, checked as it goes: the connection, the table and the
//! columns justonce writes, its row count, the unknowns and abandoned claims a scan found,
//! and the operations no provider is routed for (their unknowns are never looked up). Each
//! check says what it saw and, when it fails, the one command (CLI) or click (dashboard)
//! that fixes it. The CLI's `source add` / `source check` and the dashboard's settings
//! print these same checks; `reckon reconcile` and the queue use [`Open`] and
//! [`unrouted`] to say what is still open and why.

use crate::probe;
use crate::scan::{ScanFailure, open_source};
use futures::StreamExt;
use reckon_ledger::{Ledger, LedgerError, OperationBacklog, Route, Source, Tenant};
use reckon_sources::{EgressPolicy, ScanError};
use serde::Serialize;

/// Rows counted at most by the row-count check: past this it says "more than".
pub const ROW_COUNT_CAP: u64 = 1_000_000;

/// One check of the connect flow.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Check {
    /// What was checked: `connection`, `table`, `rows`, `scanned`, `unresolved`, `routes`.
    pub what: &'static str,
    pub ok: bool,
    /// What it saw, in a sentence.
    pub said: String,
    /// The command that fixes it (a failed check), as typed.
    pub fix: Option<String>,
    /// The same fix in the dashboard: where to click.
    pub click: Option<String>,
}

impl Check {
    fn ok(what: &'static str, said: String) -> Check {
        Check {
            what,
            ok: true,
            said,
            fix: None,
            click: None,
        }
    }

    fn fail(what: &'static str, said: String, fix: String, click: String) -> Check {
        Check {
            what,
            ok: false,
            said,
            fix: Some(fix),
            click: Some(click),
        }
    }
}

/// A command-line argument as a shell reads it back: quoted when it holds anything but
/// plain characters.
pub fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@%+=,".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The route of an operation of a source, as the reconciler picks it: the operation's
/// own, else the source's `*`.
pub fn route_of<'a>(
    routes: &'a [Route],
    source: &str,
    operation: Option<&str>,
) -> Option<&'a Route> {
    routes
        .iter()
        .find(|r| r.source == source && Some(r.operation.as_str()) == operation)
        .or_else(|| {
            routes
                .iter()
                .find(|r| r.source == source && r.operation == "*")
        })
}

/// An operation of a source with open effects and no route: they are never looked up.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Unrouted {
    pub source: String,
    /// `None`: keys with no operation part (only a `*` route reaches them).
    pub operation: Option<String>,
    pub open: i64,
}

impl Unrouted {
    /// The operation as a route names it (`*` for keys with no operation part).
    pub fn route_operation(&self) -> &str {
        self.operation.as_deref().unwrap_or("*")
    }

    /// The operation in a sentence.
    pub fn words(&self) -> String {
        match &self.operation {
            Some(op) => format!("operation {op} of source {}", self.source),
            None => format!("keys with no operation part in source {}", self.source),
        }
    }

    /// "no provider routed for operation charge of source shop: its 5 unknowns are not
    /// looked up; run `reckon route set ...`".
    pub fn sentence(&self, tenant: &str, provider: Option<&str>) -> String {
        format!(
            "no provider routed for {}: its {} open effect(s) are not looked up; run `{}`",
            self.words(),
            self.open,
            route_command(tenant, &self.source, self.route_operation(), provider)
        )
    }
}

/// `reckon route set` for an operation: to `provider`, or to a placeholder the person
/// replaces (`PROVIDER`, from `reckon provider list`).
pub fn route_command(
    tenant: &str,
    source: &str,
    operation: &str,
    provider: Option<&str>,
) -> String {
    format!(
        "reckon route set --tenant {} --source {} --operation {} --provider {}",
        shell_word(tenant),
        shell_word(source),
        shell_word(operation),
        provider.map_or_else(|| "PROVIDER".to_owned(), shell_word)
    )
}

/// The operations with open effects that no route reaches.
pub fn unrouted(backlog: &[OperationBacklog], routes: &[Route]) -> Vec<Unrouted> {
    backlog
        .iter()
        .filter(|b| route_of(routes, &b.source, b.operation.as_deref()).is_none())
        .map(|b| Unrouted {
            source: b.source.clone(),
            operation: b.operation.clone(),
            open: b.open,
        })
        .collect()
}

/// What is still open, by why. Every open effect is in exactly one count.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Open {
    /// No route reaches its operation: never looked up.
    pub unrouted: i64,
    /// Routed to no provider on purpose: only a person can say.
    pub routed_to_none: i64,
    /// Parked by the reconciler until a person looks.
    pub needs_a_person: i64,
    /// Its last answer is provisional (re-checked within minutes).
    pub provisional: i64,
    /// Routed, waiting for its next lookup.
    pub waiting: i64,
}

impl Open {
    pub fn of(backlog: &[OperationBacklog], routes: &[Route]) -> Open {
        let mut o = Open::default();
        for b in backlog {
            match route_of(routes, &b.source, b.operation.as_deref()) {
                None => o.unrouted += b.open,
                Some(r) if r.provider_id.is_none() => o.routed_to_none += b.open,
                Some(_) => {
                    let parked = b.needs_attention.min(b.open);
                    let provisional = b.provisional.min(b.open - parked);
                    o.needs_a_person += parked;
                    o.provisional += provisional;
                    o.waiting += b.open - parked - provisional;
                }
            }
        }
        o
    }

    pub fn total(&self) -> i64 {
        self.unrouted + self.routed_to_none + self.needs_a_person + self.provisional + self.waiting
    }

    /// "5 still open: 3 not looked up (no provider routed), 2 need a person" or "nothing
    /// is still open"; never an all-clear while anything is open.
    pub fn sentence(&self) -> String {
        if self.total() == 0 {
            return "nothing is still open".into();
        }
        let parts: Vec<String> = [
            (self.unrouted, "not looked up (no provider routed)"),
            (self.routed_to_none, "need a person (routed to no provider)"),
            (
                self.needs_a_person,
                "need a person (parked by the reconciler)",
            ),
            (self.provisional, "provisional (re-checked within minutes)"),
            (self.waiting, "waiting for a re-check"),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, why)| format!("{n} {why}"))
        .collect();
        format!("{} still open: {}", self.total(), parts.join(", "))
    }
}

/// The checks of one scanned source, in the order a person fixes them. `now` is the
/// ledger time the open effects are counted at.
pub async fn check_source(
    ledger: &dyn Ledger,
    tenant: &Tenant,
    source: &Source,
    egress: &EgressPolicy,
    now: f64,
) -> Result<Vec<Check>, LedgerError> {
    let t = shell_word(&tenant.slug);
    let n = shell_word(&source.name);
    let mut checks = Vec::new();
    if !source.kind.is_scanned() {
        checks.push(Check::ok(
            "connection",
            "a push source: its records arrive through POST /api/v1/effects; nothing to connect to"
                .into(),
        ));
    } else {
        // The connection test's own words (they never echo the DSN); which stage failed is
        // told by opening the source again.
        let report = probe::test_source(ledger, tenant, source, egress).await;
        if report.ok {
            checks.push(Check::ok("connection", "connected read-only".into()));
            let table = if source.mapping.is_some() {
                format!(
                    "table {} read through its column mapping",
                    source.table_name
                )
            } else {
                format!(
                    "table {} found with the columns justonce writes (key, state, request_hash, \
                     response, attempts, created_at, updated_at, expires_at)",
                    source.table_name
                )
            };
            checks.push(Check::ok("table", table));
            checks.push(count_rows(ledger, tenant, source, egress).await);
        } else {
            let edit = format!(
                "change the DSN or the table with PATCH /api/v1/sources/{} (or remove and add the \
                 source again), then run `reckon source check --tenant {t} --name {n}`",
                source.name
            );
            let click = "change what the message names, then press Check on the source".to_owned();
            let again = tokio::time::timeout(
                probe::PROBE_TIMEOUT,
                open_source(ledger, tenant, source, egress),
            )
            .await;
            match again {
                Ok(Ok(_) | Err(ScanFailure::Source(ScanError::Query(_)))) => {
                    checks.push(Check::ok("connection", "connected read-only".into()));
                    checks.push(Check::fail("table", report.message, edit, click));
                }
                // The egress policy's refusal names the operator's setting that would allow
                // it: said as it is.
                Ok(Err(ScanFailure::Source(ScanError::Invalid(m))))
                    if m.starts_with("refused by the egress policy") =>
                {
                    let fix = "the operator changes the setting the message names and restarts \
                               reckon"
                        .to_owned();
                    checks.push(Check::fail("connection", m, fix.clone(), fix));
                }
                Ok(Err(_)) | Err(_) => {
                    checks.push(Check::fail("connection", report.message, edit, click));
                }
            }
            return Ok(checks);
        }
        if source.last_success_at.is_none() {
            checks.push(Check::fail(
                "scanned",
                "not scanned yet: reckon has read none of its rows".into(),
                format!("reckon source scan --tenant {t} --name {n}"),
                format!(
                    "press Scan now on source {} (reckon serve scans it within seconds)",
                    source.name
                ),
            ));
            return Ok(checks);
        }
        checks.push(Check::ok("scanned", "scanned".into()));
    }
    let backlog: Vec<OperationBacklog> = ledger
        .unresolved_by_operation(tenant.id, now)
        .await?
        .into_iter()
        .filter(|b| b.source == source.name)
        .collect();
    let unknown: i64 = backlog.iter().map(|b| b.unknown).sum();
    let abandoned: i64 = backlog.iter().map(|b| b.open - b.unknown).sum();
    checks.push(Check::ok(
        "unresolved",
        format!("{unknown} unknown, {abandoned} abandoned claim(s) found"),
    ));
    let routes = ledger.list_routes(tenant.id).await?;
    let providers = ledger.list_providers(tenant.id).await?;
    let provider = providers.first().map(|p| p.name.as_str());
    let gaps = unrouted(&backlog, &routes);
    if gaps.is_empty() {
        let ops: Vec<String> = backlog
            .iter()
            .map(|b| {
                let op = b.operation.as_deref().unwrap_or("*");
                match route_of(&routes, &b.source, b.operation.as_deref())
                    .and_then(|r| r.provider.clone())
                {
                    Some(p) => format!("{op} → {p}"),
                    None => format!("{op} → none (a person decides)"),
                }
            })
            .collect();
        checks.push(Check::ok(
            "routes",
            if ops.is_empty() {
                "nothing open, so nothing to route yet".into()
            } else {
                format!(
                    "every operation with open effects is routed: {}",
                    ops.join(", ")
                )
            },
        ));
    } else {
        for g in gaps {
            let mut fix = route_command(&tenant.slug, &g.source, g.route_operation(), provider);
            if provider.is_none() {
                fix = format!(
                    "reckon provider add --tenant {t} --name PROVIDER --kind stripe|http \
                     --secret-env VAR, then {fix}"
                );
            }
            checks.push(Check::fail(
                "routes",
                format!(
                    "no provider routed for {}: its {} open effect(s) are not looked up",
                    g.words(),
                    g.open
                ),
                fix,
                format!(
                    "under Settings → Routing, route source {} operation {} to a provider",
                    g.source,
                    g.route_operation()
                ),
            ));
        }
    }
    Ok(checks)
}

/// Count the table's rows (up to [`ROW_COUNT_CAP`]) through the scanner's own read-only
/// connection, within the probe's time.
async fn count_rows(
    ledger: &dyn Ledger,
    tenant: &Tenant,
    source: &Source,
    egress: &EgressPolicy,
) -> Check {
    let count = async {
        let mut conn = open_source(ledger, tenant, source, egress).await?;
        let mut n: u64 = 0;
        let mut keys = conn.keys();
        while let Some(k) = keys.next().await {
            k?;
            n += 1;
            if n > ROW_COUNT_CAP {
                break;
            }
        }
        drop(keys);
        conn.close().await;
        Ok::<u64, ScanFailure>(n)
    };
    match tokio::time::timeout(probe::PROBE_TIMEOUT, count).await {
        Ok(Ok(n)) if n > ROW_COUNT_CAP => {
            Check::ok("rows", format!("more than {ROW_COUNT_CAP} rows"))
        }
        Ok(Ok(n)) => Check::ok("rows", format!("{n} row(s)")),
        Ok(Err(e)) => Check::fail(
            "rows",
            format!("could not count the rows: {e}"),
            format!(
                "reckon source check --tenant {} --name {}",
                shell_word(&tenant.slug),
                shell_word(&source.name)
            ),
            "press Check again".into(),
        ),
        Err(_) => Check::ok(
            "rows",
            format!(
                "not counted within {} s (a large table)",
                probe::PROBE_TIMEOUT.as_secs()
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(source: &str, operation: &str, provider: Option<i64>) -> Route {
        Route {
            id: 0,
            source: source.into(),
            operation: operation.into(),
            provider: provider.map(|p| format!("p{p}")),
            provider_id: provider,
            source_id: 0,
        }
    }

    fn backlog(source: &str, operation: Option<&str>, open: i64) -> OperationBacklog {
        OperationBacklog {
            source: source.into(),
            operation: operation.map(str::to_owned),
            open,
            unknown: open,
            needs_attention: 0,
            provisional: 0,
            looked_up: 0,
        }
    }

    /// Every open effect is counted once, under why it is open; nothing open is the only
    /// all-clear.
    #[test]
    fn what_is_still_open_is_counted_by_why() {
        let routes = [
            route("shop", "refund", None),
            route("shop", "charge", Some(1)),
            route("app", "*", Some(1)),
        ];
        let mut charge = backlog("shop", Some("charge"), 6);
        charge.needs_attention = 2;
        charge.provisional = 1;
        let b = [
            charge,
            backlog("shop", Some("refund"), 3),
            backlog("shop", Some("email"), 4),
            backlog("shop", None, 1),
            backlog("app", None, 5),
        ];
        let o = Open::of(&b, &routes);
        assert_eq!(
            o,
            Open {
                unrouted: 5,
                routed_to_none: 3,
                needs_a_person: 2,
                provisional: 1,
                waiting: 8,
            }
        );
        assert_eq!(
            o.sentence(),
            "19 still open: 5 not looked up (no provider routed), 3 need a person (routed to \
             no provider), 2 need a person (parked by the reconciler), 1 provisional \
             (re-checked within minutes), 8 waiting for a re-check"
        );
        assert_eq!(Open::of(&[], &routes).sentence(), "nothing is still open");
        let gaps = unrouted(&b, &routes);
        assert_eq!(gaps.len(), 2);
        assert_eq!(
            gaps[1].sentence("acme", None),
            "no provider routed for keys with no operation part in source shop: its 1 open \
             effect(s) are not looked up; run `reckon route set --tenant acme --source shop \
             --operation '*' --provider PROVIDER`"
        );
    }

    #[test]
    fn command_arguments_are_quoted_as_a_shell_reads_them() {
        assert_eq!(shell_word("charge"), "charge");
        assert_eq!(shell_word("*"), "'*'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
    }
}
