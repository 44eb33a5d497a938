//! The API document: made from the router's own registrations ([`crate::documented_router`]),
//! completed with what every operation shares, and the http provider protocol as
//! `webhooks`. Served at `/api/v1/openapi.json`; `docs/openapi.json` is this document
//! committed (`tests/it/openapi.rs` fails when they differ and says how to regenerate it).

use utoipa::openapi::path::Operation;
use utoipa::openapi::{
    ContentBuilder, OpenApi, Ref, RefOr, ResponseBuilder, security::SecurityRequirement,
};

/// The whole document.
pub fn document() -> OpenApi {
    let mut doc = crate::documented_router(crate::DEFAULT_REQUEST_TIMEOUT).into_openapi();
    for (path, item) in &mut doc.paths.paths {
        let api = path.starts_with("/api/");
        for op in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
        {
            shared_responses(op, api);
        }
    }
    add_webhooks(&mut doc);
    doc
}

/// The answers every API operation may give whatever it does, and the error body on every
/// 4xx/5xx that does not name its own.
fn shared_responses(op: &mut Operation, api: bool) {
    // An operation without its own `security` takes the document's: a tenant's token.
    let token = op.security.is_none();
    let mut shared: Vec<(&str, &str)> = Vec::new();
    if api {
        shared.push((
            "400",
            "The request is malformed: a parameter, the body's shape, an unknown field, a \
             NUL character. `error` says which.",
        ));
        shared.push((
            "500",
            "reckon's fault; the server log has the details (never the response).",
        ));
        shared.push((
            "503",
            "The request ran longer than the server's limit (`request_timeout`) and was \
             stopped. Try again later.",
        ));
    }
    if token {
        shared.push((
            "401",
            "No token, or not a live one (answered with `WWW-Authenticate: Bearer`).",
        ));
        shared.push(("403", "The token's role may not do this."));
    }
    for (status, description) in shared {
        op.responses
            .responses
            .entry(status.to_owned())
            .or_insert_with(|| RefOr::T(ResponseBuilder::new().description(description).build()));
    }
    for (status, response) in &mut op.responses.responses {
        let is_error = status.starts_with('4') || status.starts_with('5');
        if let (true, RefOr::T(response)) = (is_error, response)
            && response.content.is_empty()
        {
            response.content.insert(
                "application/json".to_owned(),
                RefOr::T(
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                ),
            );
        }
    }
}

/// The http provider protocol: each of its operations is a webhook named by its
/// operationId, with its schemas in the document's components.
fn add_webhooks(doc: &mut OpenApi) {
    use utoipa::OpenApi as _;
    let protocol = reckon_providers::http::protocol::ProtocolDoc::openapi();
    let mut webhooks = utoipa::openapi::Paths::new();
    for (_, mut item) in protocol.paths.paths {
        let op = item.get.as_mut().expect("the protocol's requests are GETs");
        let name = op.operation_id.clone().expect("webhooks are named");
        // reckon makes these requests: no token of reckon's API applies.
        op.security = Some(vec![SecurityRequirement::default()]);
        webhooks.paths.insert(name, item);
    }
    doc.webhooks = Some(webhooks);
    if let Some(components) = protocol.components {
        let ours = doc.components.get_or_insert_with(Default::default);
        ours.schemas.extend(components.schemas);
    }
}
