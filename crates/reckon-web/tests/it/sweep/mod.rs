//! The request the route sweeps (`isolation.rs`: another tenant; `roles.rs`: every role of
//! the same tenant) send to each route of the registry, with tenant A's (`acme`'s) names.
//! A new route needs a request here or both sweeps fail: that is the point.
#![allow(
    dead_code,
    reason = "a module shared by several test modules; not each uses all of it"
)]

use crate::common::{self, form};
use axum::http::Method;
use reckon_web::routes::RouteSpec;
use serde_json::json;

/// Tenant A's data that tenant B never sends (its effect's hash and response, its token's
/// label) holds this, so a leak is a substring search. (A's names do appear in B's
/// requests, and a 404 may echo what was asked.)
pub const CANARY: &str = "zqleak";
pub const A_SOURCE: &str = "acanary-src";
pub const A_KEY: &str = "charge:v1:acanary-ORD-1";
pub const A_PROVIDER: &str = "acanary-pay";

/// What of tenant A the requests name besides the constants: a token to revoke (not one
/// the sweeps authenticate with) and a stored audit run.
pub struct Fixture {
    pub a_token_id: i64,
    // A stored audit run of tenant A, holding the canary.
    pub a_audit_id: i64,
}

/// The URI (with tenant A's names in it), content type and body for each route.
pub fn request_for(
    spec: &RouteSpec,
    fx: &Fixture,
    csrf: &str,
) -> (String, Option<&'static str>, String) {
    let json = Some("application/json");
    let form_ct = Some("application/x-www-form-urlencoded");
    match (spec.method, spec.path) {
        (
            "GET",
            "/healthz" | "/readyz" | "/signin" | "/app" | "/api/v1/openapi.json" | "/favicon.ico",
        ) => (spec.path.into(), None, String::new()),
        ("GET", "/api/v1/metrics" | "/metrics") => (spec.path.into(), None, String::new()),
        ("GET", "/api/v1/sources" | "/api/v1/quarantine" | "/api/v1/tokens") => {
            (spec.path.into(), None, String::new())
        }
        ("GET", "/api/v1/effects") => (
            format!("/api/v1/effects?source={A_SOURCE}"),
            None,
            String::new(),
        ),
        ("POST", "/api/v1/sources") => (
            spec.path.into(),
            json,
            json!({"name": "b-own-source", "kind": "push"}).to_string(),
        ),
        // B edits A's source: point it elsewhere, with B's password.
        ("PATCH", "/api/v1/sources/{name}") => (
            format!("/api/v1/sources/{A_SOURCE}"),
            json,
            json!({"scan_interval": "1s", "table": "b_table"}).to_string(),
        ),
        // B edits A's provider: B's key and B's base URL.
        ("PATCH", "/api/v1/providers/{name}") => (
            format!("/api/v1/providers/{A_PROVIDER}"),
            json,
            json!({"secret": "rk_live_b", "settings": {"account": "acct_b"}}).to_string(),
        ),
        // Ask for a scan of, or probe, A's source and provider.
        ("POST", "/api/v1/sources/{name}/scan" | "/api/v1/sources/{name}/test") => {
            (spec.path.replace("{name}", A_SOURCE), None, String::new())
        }
        ("POST", "/api/v1/providers/{name}/test") => (
            format!("/api/v1/providers/{A_PROVIDER}/test"),
            None,
            String::new(),
        ),
        ("GET", "/api/v1/sources/{name}/quarantine") => (
            format!("/api/v1/sources/{A_SOURCE}/quarantine"),
            None,
            String::new(),
        ),
        ("POST", "/api/v1/effects") => (
            // Push into tenant A's source, overwriting A's effect if it could.
            format!("/api/v1/effects?source={A_SOURCE}"),
            json,
            json!([{
                "key": A_KEY, "state": "succeeded", "request_hash": "1:b",
                "response": 1, "attempts": 2, "created_at": 1_700_000_000.0,
                "updated_at": 1_800_000_000.0,
            }])
            .to_string(),
        ),
        ("GET", "/api/v1/effects/{source}/{*key}") => (
            format!("/api/v1/effects/{A_SOURCE}/charge%3Av1%3Aacanary-ORD-1"),
            None,
            String::new(),
        ),
        ("GET", "/api/v1/lookup") => ("/api/v1/lookup?q=acanary-ORD-1".into(), None, String::new()),
        ("POST", "/api/v1/tokens") => (
            spec.path.into(),
            json,
            json!({"role": "viewer", "label": "b"}).to_string(),
        ),
        ("DELETE", "/api/v1/tokens/{id}") => (
            format!("/api/v1/tokens/{}", fx.a_token_id),
            None,
            String::new(),
        ),
        // The double-charge audit.
        ("GET", "/api/v1/audits") => ("/api/v1/audits?date=2023-11-14".into(), None, String::new()),
        ("GET", "/api/v1/audits/{id}") => (
            format!("/api/v1/audits/{}?format=csv", fx.a_audit_id),
            None,
            String::new(),
        ),
        ("POST", "/api/v1/audits") => (
            // Runs B's own audit of A's day: B has no provider, so B gets a failed run of
            // its own; nothing of A's.
            spec.path.into(),
            json,
            json!({"date": "2023-11-14"}).to_string(),
        ),
        ("POST", "/signin") => (
            spec.path.into(),
            form_ct,
            // Bob is not a member of acme: signing in to it must fail.
            form(&[
                ("email", "bob@globex.test"),
                ("password", common::PASSWORD),
                ("tenant", "acme"),
            ]),
        ),
        // Reconciliation.
        ("GET", "/api/v1/providers" | "/api/v1/routes" | "/api/v1/audit-log") => {
            (spec.path.into(), None, String::new())
        }
        ("POST", "/api/v1/providers") => (
            spec.path.into(),
            json,
            json!({"name": "b-pay", "kind": "stripe", "secret": "rk_test_b"}).to_string(),
        ),
        ("PUT", "/api/v1/routes") => (
            // Route A's source to A's provider, from B.
            spec.path.into(),
            json,
            json!({"source": A_SOURCE, "operation": "refund", "provider": A_PROVIDER}).to_string(),
        ),
        ("POST", "/api/v1/effects/{source}/{*key}") => (
            format!("/api/v1/effects/{A_SOURCE}/charge%3Av1%3Aacanary-ORD-1/resolve"),
            json,
            json!({"outcome": "not_applied", "note": "b was here"}).to_string(),
        ),
        ("POST", "/api/v1/reconcile/requeue") => (
            spec.path.into(),
            json,
            json!({"provider": A_PROVIDER, "from": 0.0, "to": 2e9}).to_string(),
        ),
        ("POST", "/signout") => (spec.path.into(), form_ct, form(&[("csrf", csrf)])),
        // Write-back: B asks to write back, or to turn on write-back of, tenant A's source.
        ("POST", "/api/v1/sources/{name}/writeback") => (
            format!("/api/v1/sources/{A_SOURCE}/writeback?dry_run=false"),
            None,
            String::new(),
        ),
        ("PUT", "/api/v1/sources/{name}/writeback") => (
            format!("/api/v1/sources/{A_SOURCE}/writeback"),
            json,
            json!({"not_applied": "release"}).to_string(),
        ),
        // The dashboard: tenant A's slug in the path (the guard checks it against B's
        // memberships), A's names after it.
        ("GET", "/static/{name}") => ("/static/htmx-2.0.11.min.js".into(), None, String::new()),
        ("GET", "/t/{tenant}") => ("/t/acme".into(), None, String::new()),
        ("GET", "/t/{tenant}/queue") => (
            format!("/t/acme/queue?source={A_SOURCE}"),
            None,
            String::new(),
        ),
        ("GET", "/t/{tenant}/lookup") => {
            ("/t/acme/lookup?q=acanary-ORD-1".into(), None, String::new())
        }
        ("GET", "/t/{tenant}/settings") => ("/t/acme/settings".into(), None, String::new()),
        ("POST", "/t/{tenant}/settings/tokens") => (
            "/t/acme/settings/tokens".into(),
            form_ct,
            form(&[("csrf", csrf), ("role", "admin"), ("label", "b was here")]),
        ),
        ("POST", "/t/{tenant}/settings/tokens/{id}/revoke") => (
            format!("/t/acme/settings/tokens/{}/revoke", fx.a_token_id),
            form_ct,
            form(&[("csrf", csrf)]),
        ),
        ("POST", "/t/{tenant}/settings/providers") => (
            "/t/acme/settings/providers".into(),
            form_ct,
            form(&[
                ("csrf", csrf),
                ("name", "b-pay"),
                ("kind", "stripe"),
                ("secret", "rk_test_b"),
            ]),
        ),
        ("POST", "/t/{tenant}/settings/routes") => (
            "/t/acme/settings/routes".into(),
            form_ct,
            form(&[
                ("csrf", csrf),
                ("source", A_SOURCE),
                ("operation", "refund"),
                ("provider", A_PROVIDER),
            ]),
        ),
        ("POST", "/t/{tenant}/settings/sources/{name}/writeback") => (
            format!("/t/acme/settings/sources/{A_SOURCE}/writeback"),
            form_ct,
            form(&[("csrf", csrf), ("not_applied", "release")]),
        ),
        (
            "POST",
            "/t/{tenant}/settings/sources/{name}/scan"
            | "/t/{tenant}/settings/sources/{name}/test"
            | "/t/{tenant}/settings/sources/{name}/check",
        ) => (
            spec.path
                .replace("{tenant}", "acme")
                .replace("{name}", A_SOURCE),
            form_ct,
            form(&[("csrf", csrf)]),
        ),
        ("POST", "/t/{tenant}/settings/providers/{name}/test") => (
            format!("/t/acme/settings/providers/{A_PROVIDER}/test"),
            form_ct,
            form(&[("csrf", csrf)]),
        ),
        ("GET", "/t/{tenant}/settings/sources/{name}/quarantine") => (
            format!("/t/acme/settings/sources/{A_SOURCE}/quarantine"),
            None,
            String::new(),
        ),
        ("POST", "/t/{tenant}/settings/sources") => (
            "/t/acme/settings/sources".into(),
            form_ct,
            form(&[("csrf", csrf), ("name", "b-src"), ("kind", "push")]),
        ),
        ("POST", "/t/{tenant}/settings/people") => (
            // Make bob an admin of acme, from globex.
            "/t/acme/settings/people".into(),
            form_ct,
            form(&[
                ("csrf", csrf),
                ("email", "bob@globex.test"),
                ("role", "admin"),
            ]),
        ),
        ("POST", "/t/{tenant}/queue/requeue") => (
            "/t/acme/queue/requeue".into(),
            form_ct,
            form(&[("csrf", csrf), ("provider", A_PROVIDER)]),
        ),
        ("GET", "/t/{tenant}/audit") => (
            format!("/t/acme/audit?day=2023-11-14&run={}", fx.a_audit_id),
            None,
            String::new(),
        ),
        ("GET", "/t/{tenant}/audit/{id}/csv") => (
            format!("/t/acme/audit/{}/csv", fx.a_audit_id),
            None,
            String::new(),
        ),
        ("GET", "/t/{tenant}/effects/{source}/{*key}") => (
            format!("/t/acme/effects/{A_SOURCE}/charge%3Av1%3Aacanary-ORD-1"),
            None,
            String::new(),
        ),
        ("POST", "/t/{tenant}/resolve/{source}/{*key}") => (
            format!("/t/acme/resolve/{A_SOURCE}/charge%3Av1%3Aacanary-ORD-1"),
            form_ct,
            form(&[
                ("csrf", csrf),
                ("outcome", "applied"),
                ("note", "b was here"),
            ]),
        ),
        ("POST", "/t/{tenant}/reconcile/{source}/{*key}") => (
            format!("/t/acme/reconcile/{A_SOURCE}/charge%3Av1%3Aacanary-ORD-1"),
            form_ct,
            form(&[("csrf", csrf)]),
        ),
        (m, p) => panic!(
            "route {m} {p} has no request in the isolation sweep (tests/it/isolation.rs): add one"
        ),
    }
}

pub fn method(spec: &RouteSpec) -> Method {
    Method::from_bytes(spec.method.as_bytes()).unwrap()
}
