//! The OpenAPI document served at `/api/v1/openapi.json` describes exactly the routes the
//! router has: every public and token route of the registry is in it with its method, and
//! it names no route the registry lacks. (Session routes are the dashboard's pages, not API.)

use reckon_web::api::OPENAPI_JSON;
use reckon_web::routes::{Access, ROUTES};
use std::collections::BTreeSet;

/// The registry's template as OpenAPI writes it: `{*key}` is `{key}`; the effect POST
/// carries its action as the last segment.
fn documented_as(method: &str, path: &str) -> Vec<(String, String)> {
    let m = method.to_lowercase();
    let p = path.replace("{*key}", "{key}");
    match (method, path) {
        ("POST", "/api/v1/effects/{source}/{*key}") => vec![
            (m.clone(), format!("{p}/reconcile")),
            (m, format!("{p}/resolve")),
        ],
        _ => vec![(m, p)],
    }
}

#[test]
fn the_openapi_document_and_the_route_registry_agree() {
    let doc: serde_json::Value =
        serde_json::from_str(OPENAPI_JSON).expect("docs/openapi.json is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            documented.insert((method.clone(), path.clone()));
        }
    }
    let mut registered = BTreeSet::new();
    for spec in ROUTES {
        if matches!(spec.access, Access::Session(_)) {
            continue;
        }
        if !(spec.path.starts_with("/api/")
            || ["/healthz", "/readyz", "/metrics"].contains(&spec.path))
        {
            continue;
        }
        registered.extend(documented_as(spec.method, spec.path));
    }
    let missing: Vec<_> = registered.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&registered).collect();
    assert!(
        missing.is_empty(),
        "routes missing from docs/openapi.json: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "docs/openapi.json documents routes that do not exist: {stale:?}"
    );
    // The provider protocol (requests reckon makes) is described too.
    for hook in ["providerLookup", "providerCharges"] {
        assert!(doc["webhooks"][hook]["get"].is_object(), "webhooks.{hook}");
    }
}
