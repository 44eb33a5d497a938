//! The API document is generated from the router's own registrations, so a route cannot be
//! served without its description. These tests hold the rest of that promise: the
//! committed `docs/openapi.json` is the generated document; every token and public route of
//! the route registry (which every served route needs: the guard answers 500 for any other)
//! is documented, and nothing else is; every documented operation is really served; and
//! every operation has an id, a tag, its error bodies and a described request.
#![allow(
    clippy::string_slice,
    reason = "the texts sliced here are the tests' own ASCII: URLs, templates, tokens, HTTP heads"
)]

use crate::common;

use axum::http::{Method, StatusCode};
use common::{Backend, Req, World, send};
use reckon_web::api::OPENAPI_JSON;
use reckon_web::routes::{Access, ROUTES};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

fn document() -> Value {
    serde_json::from_str(&OPENAPI_JSON).expect("the generated document is JSON")
}

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
}

const METHODS: [&str; 5] = ["get", "put", "post", "delete", "patch"];

/// (method, path) of every documented operation.
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            assert!(
                METHODS.contains(&method.as_str()),
                "{path}: unexpected key {method}"
            );
            ops.push((method.clone(), path.clone(), op.clone()));
        }
    }
    ops
}

#[test]
fn the_committed_document_is_the_generated_one() {
    let path = committed_path();
    if std::env::var_os("RECKON_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, OPENAPI_JSON.as_str()).expect("write docs/openapi.json");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == *OPENAPI_JSON,
        "docs/openapi.json differs from the document the code generates (GET \
         /api/v1/openapi.json). Regenerate it with\n\n    RECKON_BLESS=1 cargo test -p \
         reckon-web --test it -- openapi::\n\nand commit the result."
    );
}

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
fn the_document_and_the_route_registry_agree() {
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    let documented: BTreeSet<(String, String)> = operations(&doc)
        .into_iter()
        .map(|(m, p, _)| (m, p))
        .collect();
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
        "routes without a description in the API document (register them with \
         `routes!` and a `#[utoipa::path]`): {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "the API document describes routes the registry does not have: {stale:?}"
    );
    // Every API route of the registry is a token route or one of the public few.
    for spec in ROUTES.iter().filter(|s| s.path.starts_with("/api/")) {
        assert!(
            !matches!(spec.access, Access::Session(_)),
            "{} {} is an API route behind a session",
            spec.method,
            spec.path
        );
    }
}

/// Every `.route(...)`, `.nest(...)` and their `_service` forms in the crate's source with
/// the path each registers: (file, path).
fn registrations() -> Vec<(String, String)> {
    fn files(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut found = Vec::new();
    for file in all {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.strip_prefix(&src).unwrap().display().to_string();
        for call in [".route(", ".route_service(", ".nest(", ".nest_service("] {
            for (at, _) in text.match_indices(call) {
                let rest = text[at + call.len()..].trim_start();
                let path = rest
                    .strip_prefix('"')
                    .and_then(|r| r.split_once('"'))
                    .map_or_else(
                        || panic!("{name}: {call} without a literal path"),
                        |(p, _)| p.to_owned(),
                    );
                found.push((name.clone(), path));
            }
        }
    }
    found
}

/// No API route is registered beside the documented router: under `/api` there is only
/// the nest of `api::router()` and, inside it, the effect routes' wildcard (which the
/// document describes by hand: `api::wildcard_doc`). Any other `.route` would serve a path
/// the document does not have.
#[test]
fn no_api_route_is_registered_outside_the_documented_router() {
    let found = registrations();
    assert!(found.len() > 20, "{found:?}");
    for (file, path) in found {
        let allowed = match file.as_str() {
            "lib.rs" => path == "/api/v1" || !path.starts_with("/api"),
            "api/mod.rs" => path == "/effects/{source}/{*key}",
            _ => !path.starts_with("/api"),
        };
        assert!(
            allowed,
            "{file} registers {path:?} outside the documented router: register it with \
             `.routes(routes!(handler))` and a `#[utoipa::path]` on the handler"
        );
    }
}

/// A value for a path parameter, so the request reaches the route's handler.
fn fill(path: &str) -> String {
    path.replace("{name}", "nosuch")
        .replace("{source}", "nosuch")
        .replace("{key}", "k:v1:x")
        .replace("{id}", "999999")
}

#[tokio::test]
async fn every_documented_operation_is_served() {
    let w = World::new(Backend::Sqlite).await;
    for (method, path, op) in operations(&document()) {
        let uri = fill(&path);
        let method: Method = method.to_uppercase().parse().unwrap();
        let body = op
            .get("requestBody")
            .map(|_| "{}".to_owned())
            .unwrap_or_default();
        let r = send(
            &w.app,
            method.clone(),
            &uri,
            Req {
                token: Some(&w.token_a),
                content_type: (!body.is_empty()).then_some("application/json"),
                body,
                ..Default::default()
            },
        )
        .await;
        assert_ne!(
            r.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {uri}: documented, but the router has no such method there"
        );
        assert!(
            !(r.status == StatusCode::NOT_FOUND && r.json["error"] == "no such API route"),
            "{method} {uri}: documented, but the router has no such route"
        );
        assert!(
            !r.text.contains("route registry"),
            "{method} {uri}: served, but missing from the route registry"
        );
        // Whatever it answered is documented for it.
        let status = r.status.as_str().to_owned();
        assert!(
            op["responses"].get(&status).is_some(),
            "{method} {uri}: answered {status}, which its description does not list: {}",
            r.text
        );
    }
    w.finish().await;
}

#[test]
fn every_operation_has_an_id_a_tag_its_errors_and_its_schemas() {
    let doc = document();
    let mut ids = BTreeSet::new();
    for (method, path, op) in operations(&doc) {
        let what = format!("{method} {path}");
        let id = op["operationId"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no operationId"));
        assert!(ids.insert(id.to_owned()), "{what}: operationId {id} twice");
        assert!(
            op["tags"].as_array().is_some_and(|t| !t.is_empty()),
            "{what}: no tag"
        );
        let responses = op["responses"].as_object().unwrap();
        let token = op.get("security").is_none();
        let api = path.starts_with("/api/");
        let mut wanted = Vec::new();
        if api {
            wanted.extend(["400", "500", "503"]);
        }
        if token {
            wanted.extend(["401", "403"]);
        }
        for status in wanted {
            assert!(responses.contains_key(status), "{what}: no {status}");
        }
        for (status, response) in responses {
            let content = &response["content"];
            if status.starts_with('4') || status.starts_with('5') {
                if !api && content.get("application/json").is_none() {
                    // The probes answer text (readyz's 503).
                    continue;
                }
                assert_eq!(
                    content["application/json"]["schema"]["$ref"], "#/components/schemas/ErrorBody",
                    "{what} {status}: not the error body"
                );
            } else if status != "204" {
                assert!(
                    content.as_object().is_some_and(|c| !c.is_empty()),
                    "{what} {status}: no content described"
                );
            }
        }
        if let Some(body) = op.get("requestBody") {
            for (media, c) in body["content"].as_object().unwrap() {
                assert!(
                    c["schema"].is_object(),
                    "{what}: {media} body has no schema"
                );
            }
        }
    }
    // The bearer scheme, and the http provider protocol as webhooks.
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    for hook in ["providerLookup", "providerCharges"] {
        let op = &doc["webhooks"][hook]["get"];
        assert!(op.is_object(), "webhooks.{hook}");
        assert!(
            op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
                .as_str()
                .is_some_and(|r| r.starts_with("#/components/schemas/Provider")),
            "webhooks.{hook}: {op}"
        );
    }
}

/// Every `$ref` names a schema the document has.
#[test]
fn every_reference_resolves() {
    fn walk(v: &Value, refs: &mut BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    refs.insert(r.clone());
                }
                m.values().for_each(|v| walk(v, refs));
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, refs)),
            _ => {}
        }
    }
    let doc = document();
    let mut refs = BTreeSet::new();
    walk(&doc, &mut refs);
    assert!(refs.len() > 20, "{refs:?}");
    for r in refs {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("{r}: not a schema reference"));
        assert!(
            doc["components"]["schemas"][name].is_object(),
            "{r} does not resolve"
        );
    }
}

/// The enums and limits the server checks are in the document (a sample: each would let a
/// generated case through that the server refuses, or the other way round).
#[test]
fn enums_and_limits_are_described() {
    let doc = document();
    let schemas = &doc["components"]["schemas"];
    let words = |name: &str| -> Vec<String> {
        schemas[name]["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("{name} is not an enum: {}", schemas[name]))
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        words("Verdict"),
        [
            "applied",
            "duplicate",
            "not_applied",
            "pending",
            "missing",
            "unknown",
            "in_progress"
        ]
    );
    assert_eq!(
        words("Outcome"),
        ["applied", "not_applied", "duplicate", "indeterminate"]
    );
    assert_eq!(
        words("ManualOutcome"),
        ["applied", "not_applied", "duplicate"]
    );
    assert_eq!(
        words("EffectState"),
        ["in_progress", "succeeded", "failed", "unknown"]
    );
    assert_eq!(words("Role"), ["viewer", "support", "finance", "admin"]);
    // Every field `Effect` carries, and no other (the server's answers are checked against
    // it by the generated-case run).
    let effect = &schemas["Effect"];
    assert_eq!(effect["additionalProperties"], false);
    assert_eq!(effect["properties"].as_object().unwrap().len(), 20);
    assert_eq!(
        schemas["ResolveInput"]["properties"]["note"]["maxLength"],
        4000
    );
    assert_eq!(schemas["NewToken"]["properties"]["label"]["maxLength"], 100);
    let limit = doc["paths"]["/api/v1/effects"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .unwrap()
        .clone();
    assert_eq!(limit["schema"]["maximum"], 1000);
    assert_eq!(limit["schema"]["minimum"], 1);
}
