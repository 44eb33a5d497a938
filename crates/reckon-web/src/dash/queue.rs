//! The unresolved queue: filtered and keyset-paged ([`QUEUE_PAGE`] rows a page), and its
//! bulk re-lookup of one provider's indeterminate effects.

use super::chrome::{Chrome, bad_request, given, other_tenants};
use super::csrf::{accept, csrf_form};
use super::effect::replay_left;
use super::fmt::{When, age, effect_href, seg, when_in, when_opt_in};
use super::{PageError, html, not_found, wants_fragment};
use crate::AppState;
use crate::authz::{Permission, allows};
use crate::session::WebSession;
use askama::Template;
use axum::Extension;
use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use reckon_domain::time;
use reckon_engine::commands::{self, CommandError};
use reckon_engine::read::queue::queue_view;
use reckon_ledger::{LedgerError, QueueQuery};
use serde::Deserialize;

/// Queue rows per page.
pub const QUEUE_PAGE: i64 = 50;

#[derive(Deserialize, Default)]
pub struct QueueParams {
    source: Option<String>,
    operation: Option<String>,
    kind: Option<String>,
    provider: Option<String>,
    outcome: Option<String>,
    attention: Option<String>,
    after: Option<String>,
    requeued: Option<i64>,
}

pub struct Filters {
    pub source: String,
    pub operation: String,
    pub kind: String,
    pub provider: String,
    pub outcome: String,
    pub attention: bool,
}

#[derive(Template)]
#[template(path = "queue.html", blocks = ["rows"])]
pub struct QueuePage {
    pub c: Chrome,
    pub f: Filters,
    /// (name, selected)
    pub sources: Vec<(String, bool)>,
    pub providers: Vec<(String, bool)>,
    pub outcomes: Vec<(&'static str, bool)>,
    pub rows: Vec<QueueRowView>,
    pub next_href: Option<String>,
    pub filtered: bool,
    /// Finance and admin may re-look up a provider's indeterminate effects in bulk.
    pub can_requeue: bool,
    /// After a bulk re-lookup: how many effects are due again.
    pub requeued: Option<i64>,
    /// For the empty state: when the queue last held something.
    pub cleared: String,
    /// Each operation with open effects that no provider is routed for: never looked up.
    pub unrouted: Vec<String>,
    /// Where routes are set (admins), else empty.
    pub routing_href: String,
}

pub struct QueueRowView {
    /// No route reaches its operation: it is never looked up until one does.
    pub unrouted: bool,
    /// Routed to no provider on purpose: a person decides.
    pub routed_to_none: bool,
    pub href: String,
    pub source: String,
    pub key: String,
    pub operation: String,
    pub kind: &'static str,
    pub age: String,
    pub since: When,
    pub attempts: i64,
    pub lookups: i64,
    pub last_outcome: Option<String>,
    pub last_error: Option<String>,
    pub next_attempt: Option<When>,
    pub replay_left: String,
    pub needs_attention: bool,
    pub provider: Option<String>,
}

pub const KINDS: [&str; 2] = ["unknown", "abandoned"];
pub const OUTCOMES: [&str; 4] = ["indeterminate", "applied", "not_applied", "duplicate"];

pub async fn queue(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    headers: HeaderMap,
    p: Result<Query<QueueParams>, QueryRejection>,
) -> Result<Response, PageError> {
    let Ok(Query(p)) = p else {
        return Ok(bad_request("The filters are malformed."));
    };
    let kind = given(&p.kind);
    if kind.as_deref().is_some_and(|k| !KINDS.contains(&k)) {
        return Ok(bad_request("kind must be unknown or abandoned."));
    }
    let outcome = given(&p.outcome);
    if outcome.as_deref().is_some_and(|o| !OUTCOMES.contains(&o)) {
        return Ok(bad_request(
            "outcome must be indeterminate, applied, not_applied or duplicate.",
        ));
    }
    let after = match given(&p.after) {
        None => None,
        Some(a) => match a
            .split_once(':')
            .and_then(|(t, id)| Some((t.parse::<f64>().ok()?, id.parse::<i64>().ok()?)))
        {
            Some((t, id)) if t.is_finite() => Some((t, id)),
            _ => {
                return Ok(bad_request(
                    "after must be <since>:<id>, as the next-page link has it.",
                ));
            }
        },
    };
    let attention = given(&p.attention).is_some();
    let now = time::now();
    let q = QueueQuery {
        source: given(&p.source),
        operation: given(&p.operation),
        kind,
        provider: given(&p.provider),
        outcome,
        needs_attention: attention,
        after,
        limit: QUEUE_PAGE,
        now,
    };
    let fragment = wants_fragment(&headers);
    let view = queue_view(&*st.ledger, s.tenant.id, &s.tenant.slug, &q, !fragment).await?;
    let tz = &view.zone;
    let mut c = Chrome::new(&s, "queue");
    let f = Filters {
        source: q.source.clone().unwrap_or_default(),
        operation: q.operation.clone().unwrap_or_default(),
        kind: q.kind.clone().unwrap_or_default(),
        provider: q.provider.clone().unwrap_or_default(),
        outcome: q.outcome.clone().unwrap_or_default(),
        attention,
    };
    let next_href = view.next_after.map(|(since, id)| {
        let mut qs = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("source", &f.source),
            ("operation", &f.operation),
            ("kind", &f.kind),
            ("provider", &f.provider),
            ("outcome", &f.outcome),
        ] {
            if !v.is_empty() {
                qs.append_pair(k, v);
            }
        }
        if attention {
            qs.append_pair("attention", "1");
        }
        qs.append_pair("after", &format!("{since}:{id}"));
        format!("{}/queue?{}", c.base, qs.finish())
    });
    let rows: Vec<QueueRowView> = view
        .rows
        .iter()
        .map(|x| {
            let r = &x.row;
            QueueRowView {
                href: effect_href(&s.tenant.slug, &r.effect.source, &r.effect.key),
                source: r.effect.source.clone(),
                key: r.effect.key.clone(),
                operation: r.effect.operation.clone().unwrap_or_default(),
                kind: x.kind,
                age: age(now - r.since),
                since: when_in(r.since, tz),
                attempts: r.effect.attempts,
                lookups: r.lookups,
                last_outcome: x.last_outcome.clone(),
                last_error: r.last_error.clone(),
                next_attempt: when_opt_in(x.next_attempt, tz),
                unrouted: x.unrouted,
                routed_to_none: x.routed_to_none,
                replay_left: replay_left(&st, r.effect.created_at, now),
                needs_attention: r.needs_attention,
                provider: r.provider.clone(),
            }
        })
        .collect();
    let filtered = q.source.is_some()
        || q.operation.is_some()
        || q.kind.is_some()
        || q.provider.is_some()
        || q.outcome.is_some()
        || attention
        || after.is_some();
    if !fragment {
        c.tenants = other_tenants(&st, &s).await?;
    }
    let selected = |names: &[String], on: &str| -> Vec<(String, bool)> {
        names.iter().map(|n| (n.clone(), n == on)).collect()
    };
    let sources = selected(&view.sources, &f.source);
    let providers = selected(&view.providers, &f.provider);
    let outcomes = OUTCOMES.iter().map(|o| (*o, *o == f.outcome)).collect();
    let cleared = view.cleared.clone();
    let unrouted = view
        .unrouted
        .iter()
        .map(|g| super::fmt::sentence(g))
        .collect();
    let can_route = allows(s.role, Permission::ManageSources);
    let page = QueuePage {
        unrouted,
        routing_href: if can_route {
            format!("/t/{}/settings#routing", seg(&s.tenant.slug))
        } else {
            String::new()
        },
        c,
        f,
        sources,
        providers,
        outcomes,
        rows,
        next_href,
        filtered,
        can_requeue: allows(s.role, Permission::ResolveManually),
        requeued: p.requeued,
        cleared,
    };
    if fragment {
        return Ok(html(StatusCode::OK, &page.as_rows(), true));
    }
    Ok(html(StatusCode::OK, &page, true))
}

#[derive(Deserialize)]
pub struct RequeueForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    provider: String,
}

csrf_form!(RequeueForm);

/// The queue's bulk re-lookup: every indeterminate effect of the filtered provider is due
/// again now (and no longer parked as needing attention), through the same ledger step as
/// `POST /api/v1/reconcile/requeue`, recorded in the audit log the same way. Answered 303
/// to the queue filtered by that provider, saying how many.
pub async fn requeue(
    State(st): State<AppState>,
    Extension(s): Extension<WebSession>,
    form: Result<Form<RequeueForm>, FormRejection>,
) -> Result<Response, PageError> {
    let form = match accept(&s, form) {
        Ok(f) => f,
        Err(refusal) => return Ok(refusal),
    };
    let name = form.provider.trim();
    if name.is_empty() {
        return Ok(bad_request(
            "Choose a provider first: a bulk re-lookup asks one provider again.",
        ));
    }
    let now = time::now();
    let ctx = crate::actions::dash_ctx(&st, &s);
    let (provider, n) = match commands::requeue(&ctx, name, 0.0, now).await {
        Ok(done) => done,
        Err(CommandError::Ledger(LedgerError::NotFound(_))) => return Ok(not_found()),
        Err(e) => return Err(crate::error::ApiError::from(e).into()),
    };
    st.dash.forget(s.tenant.id);
    let mut qs = url::form_urlencoded::Serializer::new(String::new());
    qs.append_pair("provider", &provider.name);
    qs.append_pair("requeued", &n.to_string());
    Ok(Redirect::to(&format!("/t/{}/queue?{}", seg(&s.tenant.slug), qs.finish())).into_response())
}
