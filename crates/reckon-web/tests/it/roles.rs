//! The role matrix over every route (T03) and no state-changing GET (T20), through the
//! route registry (`reckon_web::routes::ROUTES`) the router's guard enforces.
//!
//! - T03: each route is called by tenant `acme`'s own people, one of each role (viewer,
//!   support, finance, admin), with a token for API routes and a dashboard session for
//!   dashboard routes. The roles the declared policy below allows get past the guard (not
//!   403, not 401, not a redirect to sign-in); the others get 403. The policy is written
//!   out here, route by route, independently of the registry and of `authz.rs`: a route
//!   whose permission changes, or a new route, fails until this table says so.
//! - T20: every GET route, called by an admin, leaves every row of every ledger table as
//!   it was (a full dump of the SQLite ledger before and after), but for the one write
//!   by design: an export appends its line to the action log.

use crate::common;
use crate::sweep;

use axum::http::StatusCode;
use common::{Backend, Req, World, same_origin, send, session, token, user};
use reckon_ledger::{NewProvider, Role};
use reckon_web::routes::{Access, ROUTES, RouteSpec};
use serde_json::json;
use std::collections::BTreeMap;
use sweep::{A_KEY, A_PROVIDER, A_SOURCE, Fixture, method, request_for};

/// Who may call each route: `None` for anyone (public), else the least role. This is the
/// declared policy the sweep compares the router with.
const POLICY: &[(&str, &str, Option<Role>)] = {
    use Role::{Admin, Finance, Support, Viewer};
    &[
        ("GET", "/healthz", None),
        ("GET", "/readyz", None),
        ("GET", "/api/v1/openapi.json", None),
        ("GET", "/api/v1/sources", Some(Viewer)),
        ("POST", "/api/v1/sources", Some(Admin)),
        ("PATCH", "/api/v1/sources/{name}", Some(Admin)),
        ("POST", "/api/v1/sources/{name}/scan", Some(Admin)),
        ("POST", "/api/v1/sources/{name}/test", Some(Admin)),
        ("GET", "/api/v1/sources/{name}/quarantine", Some(Support)),
        ("GET", "/api/v1/quarantine", Some(Viewer)),
        ("GET", "/api/v1/effects", Some(Support)),
        ("POST", "/api/v1/effects", Some(Admin)),
        ("GET", "/api/v1/effects/{source}/{*key}", Some(Support)),
        ("GET", "/api/v1/lookup", Some(Support)),
        ("GET", "/api/v1/providers", Some(Viewer)),
        ("POST", "/api/v1/providers", Some(Admin)),
        ("PATCH", "/api/v1/providers/{name}", Some(Admin)),
        ("POST", "/api/v1/providers/{name}/test", Some(Admin)),
        ("GET", "/api/v1/routes", Some(Viewer)),
        ("PUT", "/api/v1/routes", Some(Admin)),
        ("POST", "/api/v1/effects/{source}/{*key}", Some(Support)),
        ("POST", "/api/v1/reconcile/requeue", Some(Finance)),
        ("GET", "/api/v1/audit-log", Some(Admin)),
        ("GET", "/api/v1/tokens", Some(Admin)),
        ("POST", "/api/v1/tokens", Some(Admin)),
        ("DELETE", "/api/v1/tokens/{id}", Some(Admin)),
        ("GET", "/api/v1/audits", Some(Finance)),
        ("POST", "/api/v1/audits", Some(Finance)),
        ("GET", "/api/v1/audits/{id}", Some(Finance)),
        ("POST", "/api/v1/sources/{name}/writeback", Some(Admin)),
        ("PUT", "/api/v1/sources/{name}/writeback", Some(Admin)),
        ("GET", "/api/v1/metrics", Some(Viewer)),
        ("GET", "/metrics", None),
        ("GET", "/signin", None),
        ("POST", "/signin", None),
        ("POST", "/signout", Some(Viewer)),
        ("GET", "/app", Some(Viewer)),
        ("GET", "/static/{name}", None),
        ("GET", "/favicon.ico", None),
        ("GET", "/t/{tenant}", Some(Viewer)),
        ("GET", "/t/{tenant}/queue", Some(Support)),
        ("POST", "/t/{tenant}/queue/requeue", Some(Finance)),
        ("GET", "/t/{tenant}/lookup", Some(Support)),
        ("GET", "/t/{tenant}/settings", Some(Admin)),
        ("POST", "/t/{tenant}/settings/tokens", Some(Admin)),
        (
            "POST",
            "/t/{tenant}/settings/tokens/{id}/revoke",
            Some(Admin),
        ),
        ("POST", "/t/{tenant}/settings/providers", Some(Admin)),
        ("POST", "/t/{tenant}/settings/routes", Some(Admin)),
        ("POST", "/t/{tenant}/settings/sources", Some(Admin)),
        ("POST", "/t/{tenant}/settings/people", Some(Admin)),
        (
            "POST",
            "/t/{tenant}/settings/sources/{name}/writeback",
            Some(Admin),
        ),
        (
            "GET",
            "/t/{tenant}/settings/sources/{name}/quarantine",
            Some(Admin),
        ),
        (
            "POST",
            "/t/{tenant}/settings/sources/{name}/scan",
            Some(Admin),
        ),
        (
            "POST",
            "/t/{tenant}/settings/sources/{name}/test",
            Some(Admin),
        ),
        (
            "POST",
            "/t/{tenant}/settings/sources/{name}/check",
            Some(Admin),
        ),
        (
            "POST",
            "/t/{tenant}/settings/providers/{name}/test",
            Some(Admin),
        ),
        ("GET", "/t/{tenant}/audit", Some(Finance)),
        ("GET", "/t/{tenant}/audit/{id}/csv", Some(Finance)),
        ("GET", "/t/{tenant}/effects/{source}/{*key}", Some(Support)),
        ("POST", "/t/{tenant}/resolve/{source}/{*key}", Some(Support)),
        (
            "POST",
            "/t/{tenant}/reconcile/{source}/{*key}",
            Some(Support),
        ),
    ]
};

const ROLES: [(Role, &str); 4] = [
    (Role::Viewer, "vic@acme.test"),
    (Role::Support, "sue@acme.test"),
    (Role::Finance, "fin@acme.test"),
    (Role::Admin, "alice@acme.test"),
];

/// Tenant acme with a push source holding one unknown effect, a provider (whose base URL
/// is on loopback, refused by the default egress policy: nothing leaves the test) routed
/// to, a token to revoke, a stored audit run, one person of each role and a token of each
/// role.
struct Acme {
    fx: Fixture,
    tokens: BTreeMap<Role, String>,
}

async fn seed(w: &World) -> Acme {
    let r = send(
        &w.app,
        axum::http::Method::POST,
        "/api/v1/sources",
        Req {
            token: Some(&w.token_a),
            content_type: Some("application/json"),
            body: json!({"name": A_SOURCE, "kind": "push"}).to_string(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let record = json!([{
        "key": A_KEY, "state": "unknown", "request_hash": "1:roles",
        "response": "r", "attempts": 1, "created_at": 1_700_000_000.0,
        "updated_at": 1_700_000_001.0,
    }]);
    let r = send(
        &w.app,
        axum::http::Method::POST,
        &format!("/api/v1/effects?source={A_SOURCE}"),
        Req {
            token: Some(&w.token_a),
            content_type: Some("application/json"),
            body: record.to_string(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    w.ledger
        .add_provider(
            w.a.id,
            NewProvider {
                name: A_PROVIDER.into(),
                kind: reckon_ledger::ProviderKind::Stripe,
                secret: Some(secrecy::SecretString::from("rk_test_roles".to_owned())),
                settings: json!({"account": "acct_roles", "base_url": "http://127.0.0.1:9"}),
            },
        )
        .await
        .unwrap();
    w.ledger
        .set_route(w.a.id, A_SOURCE, "charge", Some(A_PROVIDER))
        .await
        .unwrap();
    let (_, hash) = reckon_web::mint_token();
    let a_token_id = w
        .ledger
        .create_token_by(
            w.a.id,
            Role::Viewer,
            &hash,
            "to revoke",
            reckon_ledger::TokenCreator::Operator,
        )
        .await
        .unwrap();
    let run = reckon_ledger::NewAuditRun {
        day: "2023-11-14".into(),
        time_zone: "UTC".into(),
        window_start: 1_699_920_000.0,
        window_end: 1_700_006_400.0,
        provider: "*".into(),
        triggered_by: "operator".into(),
        status: "complete".into(),
        reason: None,
        started_at: 1_700_100_000.0,
        finished_at: 1_700_100_001.0,
        counts: json!({"findings": {}}),
        findings: json!([]),
        totals: json!([]),
        evidence: json!({"pages": []}),
    };
    let a_audit_id = w
        .ledger
        .record_audit_run(w.a.id, run, None)
        .await
        .unwrap()
        .id;
    let mut tokens = BTreeMap::new();
    for (role, email) in ROLES {
        if role != Role::Admin {
            user(w.ledger.as_ref(), email, &w.a, role).await;
        }
        tokens.insert(role, token(w.ledger.as_ref(), &w.a, role).await);
    }
    Acme {
        fx: Fixture {
            a_token_id,
            a_audit_id,
        },
        tokens,
    }
}

fn declared(spec: &RouteSpec) -> Option<Role> {
    POLICY
        .iter()
        .find(|(m, p, _)| *m == spec.method && *p == spec.path)
        .unwrap_or_else(|| {
            panic!(
                "route {} {} is not in the declared policy of tests/it/roles.rs: add it",
                spec.method, spec.path
            )
        })
        .2
}

/// T03.
#[tokio::test]
async fn every_route_lets_in_exactly_the_roles_the_policy_allows() {
    let w = World::new(Backend::Sqlite).await;
    let acme = seed(&w).await;
    // The declared policy names every route of the registry, and nothing else.
    for (m, p, _) in POLICY {
        assert!(
            ROUTES.iter().any(|r| r.method == *m && r.path == *p),
            "{m} {p} is declared but not registered"
        );
    }
    let mut sessions: BTreeMap<Role, (String, String)> = BTreeMap::new();
    for (role, email) in ROLES {
        sessions.insert(role, session(&w.app, email).await);
    }
    let mut checked = 0;
    for spec in ROUTES {
        let least = declared(spec);
        // The registry's own permission agrees with the declared policy.
        match (spec.access, least) {
            (Access::Public, None) => {}
            (Access::Token(p) | Access::Session(p), Some(role)) => {
                assert_eq!(p.least_role(), role, "{} {}", spec.method, spec.path);
            }
            (a, l) => panic!(
                "{} {}: registry {a:?}, declared {l:?}",
                spec.method, spec.path
            ),
        }
        for (role, email) in ROLES {
            let allowed = least.is_none_or(|least| role >= least);
            let (cookie, csrf) = sessions[&role].clone();
            let (uri, ct, body) = request_for(spec, &acme.fx, &csrf);
            let req = match spec.access {
                Access::Token(_) => Req {
                    token: Some(&acme.tokens[&role]),
                    content_type: ct,
                    body,
                    ..Default::default()
                },
                Access::Session(_) | Access::Public => Req {
                    cookie: Some(&cookie),
                    content_type: ct,
                    headers: same_origin(),
                    body,
                    ..Default::default()
                },
            };
            let r = send(&w.app, method(spec), &uri, req).await;
            let who = format!("{} {uri} as {}", spec.method, role.as_str());
            assert!(
                !r.status.is_server_error(),
                "{who}: {} {}",
                r.status,
                r.text
            );
            if allowed {
                assert_ne!(r.status, StatusCode::FORBIDDEN, "{who}: {}", r.text);
                // (Signing out answers with a redirect to /signin: that is its success.)
                if spec.access != Access::Public && spec.path != "/signout" {
                    assert_ne!(r.status, StatusCode::UNAUTHORIZED, "{who}: {}", r.text);
                    assert_ne!(r.location(), Some("/signin"), "{who}");
                }
            } else {
                assert_eq!(r.status, StatusCode::FORBIDDEN, "{who}: {}", r.text);
            }
            if spec.path == "/signout" {
                // Signing out ended the session: a fresh one for the next routes.
                sessions.insert(role, session(&w.app, email).await);
            }
            checked += 1;
        }
    }
    assert_eq!(checked, ROUTES.len() * ROLES.len());
    w.finish().await;
}

/// Every row of every table of the SQLite ledger, as SQL (Python's `iterdump`, read-only).
fn dump(db: &std::path::Path) -> String {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys\n\
             c=sqlite3.connect('file:'+sys.argv[1]+'?mode=ro',uri=True)\n\
             print('\\n'.join(c.iterdump()))",
        ])
        .arg(db)
        .output()
        .expect("python3 dumps the ledger");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// T20.
#[tokio::test]
async fn no_get_route_changes_anything() {
    let w = World::new(Backend::Sqlite).await;
    let acme = seed(&w).await;
    let admin = &acme.tokens[&Role::Admin];
    let (cookie, csrf) = session(&w.app, "alice@acme.test").await;
    // The token's first use records its last-used time (at most once a minute, by design):
    // use it once before the first dump.
    let r = send(
        &w.app,
        axum::http::Method::GET,
        "/api/v1/sources",
        Req {
            token: Some(admin),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let db = w.data_dir().join("reckon.db");
    let before = dump(&db);
    assert!(before.contains(A_KEY), "the dump holds the ledger's rows");
    let mut called = 0;
    for spec in ROUTES.iter().filter(|r| r.method == "GET") {
        let (uri, _, _) = request_for(spec, &acme.fx, &csrf);
        let req = match spec.access {
            Access::Token(_) => Req {
                token: Some(admin),
                ..Default::default()
            },
            _ => Req {
                cookie: Some(&cookie),
                ..Default::default()
            },
        };
        let r = send(&w.app, method(spec), &uri, req).await;
        assert!(!r.status.is_server_error(), "GET {uri}: {}", r.text);
        assert_ne!(r.status, StatusCode::FORBIDDEN, "GET {uri}: {}", r.text);
        called += 1;
    }
    assert!(called >= 25, "{called}");
    let after = dump(&db);
    // The one write a GET makes, by design: an export (the audit's CSV, from the API and
    // from the dashboard) is one of the people's actions the append-only action log
    // records. Nothing else may differ.
    let is_sequence =
        |l: &&str| l.starts_with("INSERT INTO \"sqlite_sequence\" VALUES('audit_log',");
    let b: std::collections::BTreeSet<&str> = before.lines().collect();
    let a: std::collections::BTreeSet<&str> = after.lines().collect();
    let gone: Vec<&str> = b
        .difference(&a)
        .copied()
        .filter(|l| !is_sequence(l))
        .collect();
    let (exports, other): (Vec<&str>, Vec<&str>) = a
        .difference(&b)
        .copied()
        .filter(|l| !is_sequence(l))
        .partition(|l| {
            l.starts_with("INSERT INTO \"audit_log\" VALUES(") && l.contains(",'export','audit:")
        });
    assert!(
        gone.is_empty() && other.is_empty(),
        "a GET changed the ledger:\n- {gone:#?}\n+ {other:#?}"
    );
    assert_eq!(
        exports.len(),
        2,
        "the two CSV exports are logged: {exports:#?}"
    );
    w.finish().await;
}
