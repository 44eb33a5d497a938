//! Two tenants on a real ledger (SQLite file or a fresh PostgreSQL database), people with
//! passwords, tokens, and a way to drive the whole app in-process like a browser would.
#![allow(
    dead_code,
    reason = "a module shared by several test modules; not each uses all of it"
)]
#![allow(
    clippy::string_slice,
    reason = "the texts sliced here are the tests' own ASCII: URLs, templates, tokens, HTTP heads"
)]

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use reckon_ledger::{Keyring, Ledger, Role, Tenant, TokenCreator};
use reckon_web::{AppState, app, mint_token};
use serde_json::Value;
use sqlx::{AssertSqlSafe, Connection};
use std::sync::Arc;
use tower::ServiceExt;

pub const PASSWORD: &str = "correct horse battery staple";

pub enum Backend {
    Sqlite,
    Postgres,
}

pub struct World {
    _dir: tempfile::TempDir,
    pg: Option<(String, String)>,
    pub ledger: Arc<dyn Ledger>,
    pub app: Router,
    pub a: Tenant,
    pub b: Tenant,
    /// Operator-made admin tokens.
    pub token_a: String,
    pub token_b: String,
    /// Admin people.
    pub alice: i64,
    pub bob: i64,
}

pub async fn token(ledger: &dyn Ledger, tenant: &Tenant, role: Role) -> String {
    let (token, hash) = mint_token();
    ledger
        .create_token_by(tenant.id, role, &hash, "test", TokenCreator::Operator)
        .await
        .unwrap();
    token
}

pub async fn user(ledger: &dyn Ledger, email: &str, tenant: &Tenant, role: Role) -> i64 {
    let hash = reckon_web::password::hash_blocking(PASSWORD);
    let u = ledger.create_user(email, &hash).await.unwrap();
    ledger.set_membership(tenant.id, u.id, role).await.unwrap();
    u.id
}

impl World {
    pub async fn new(backend: Backend) -> World {
        let dir = tempfile::TempDir::new().unwrap();
        let keyring = Keyring::from_bytes(&[7u8; 32]).unwrap();
        let (ledger, pg) = match backend {
            Backend::Sqlite => (
                reckon_ledger::connect(None, dir.path(), keyring)
                    .await
                    .unwrap(),
                None,
            ),
            Backend::Postgres => {
                let db = reckon_testkit::FreshDb::postgres("reckon_w").await;
                let (admin, url) = (db.admin_url, db.url);
                let db = db.name;
                (
                    reckon_ledger::connect(Some(&url), dir.path(), keyring)
                        .await
                        .unwrap(),
                    Some((admin, db)),
                )
            }
        };
        let a = ledger.create_tenant("acme").await.unwrap();
        let b = ledger.create_tenant("globex").await.unwrap();
        let token_a = token(ledger.as_ref(), &a, Role::Admin).await;
        let token_b = token(ledger.as_ref(), &b, Role::Admin).await;
        let alice = user(ledger.as_ref(), "alice@acme.test", &a, Role::Admin).await;
        let bob = user(ledger.as_ref(), "bob@globex.test", &b, Role::Admin).await;
        let app = app(AppState::new(ledger.clone()));
        World {
            _dir: dir,
            pg,
            ledger,
            app,
            a,
            b,
            token_a,
            token_b,
            alice,
            bob,
        }
    }

    /// The directory of the SQLite ledger (`reckon.db`).
    pub fn data_dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    /// (admin URL, database name) of the PostgreSQL ledger.
    pub fn pg_database(&self) -> Option<(&str, &str)> {
        self.pg.as_ref().map(|(a, d)| (a.as_str(), d.as_str()))
    }

    /// Drop the PostgreSQL database (a failing test leaves it behind to look at).
    pub async fn finish(self) {
        let World { ledger, pg, .. } = self;
        drop(ledger);
        if let Some((admin, db)) = pg
            && let Ok(mut conn) = sqlx::PgConnection::connect(&admin).await
        {
            let _ = sqlx::raw_sql(AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"
            )))
            .execute(&mut conn)
            .await;
        }
    }
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub text: String,
    pub json: Value,
}

impl Reply {
    pub fn location(&self) -> Option<&str> {
        self.headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
    }

    /// The session id this reply sets, if any.
    pub fn session_cookie(&self) -> Option<String> {
        self.headers
            .get_all(header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|c| c.strip_prefix("__Host-reckon_session="))
            .map(|c| c.split(';').next().unwrap_or_default().to_owned())
            .filter(|c| !c.is_empty())
    }
}

/// A request as a browser or a client would send it.
#[derive(Default, Clone)]
pub struct Req<'a> {
    pub token: Option<&'a str>,
    pub cookie: Option<&'a str>,
    pub headers: Vec<(&'a str, String)>,
    pub content_type: Option<&'a str>,
    pub body: String,
}

pub async fn send(app: &Router, method: Method, uri: &str, r: Req<'_>) -> Reply {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::HOST, "reckon.test");
    if let Some(t) = r.token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    if let Some(c) = r.cookie {
        req = req.header(header::COOKIE, format!("__Host-reckon_session={c}"));
    }
    if let Some(ct) = r.content_type {
        req = req.header(header::CONTENT_TYPE, ct);
    }
    for (k, v) in &r.headers {
        req = req.header(*k, v);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::from(r.body)).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Reply {
        status,
        headers,
        text,
        json,
    }
}

pub fn form(pairs: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// Same-origin browser form post headers.
pub fn same_origin() -> Vec<(&'static str, String)> {
    vec![
        ("origin", "https://reckon.test".into()),
        ("sec-fetch-site", "same-origin".into()),
    ]
}

pub async fn sign_in(app: &Router, email: &str, password: &str, extra: &[(&str, &str)]) -> Reply {
    let mut pairs = vec![("email", email), ("password", password)];
    pairs.extend_from_slice(extra);
    send(
        app,
        Method::POST,
        "/signin",
        Req {
            content_type: Some("application/x-www-form-urlencoded"),
            headers: same_origin(),
            body: form(&pairs),
            ..Default::default()
        },
    )
    .await
}

/// Sign in and return (session id, CSRF token of the session).
pub async fn session(app: &Router, email: &str) -> (String, String) {
    let r = sign_in(app, email, PASSWORD, &[]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let id = r.session_cookie().expect("a session cookie");
    let page = send(
        app,
        Method::GET,
        "/app",
        Req {
            cookie: Some(&id),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    let csrf = page
        .text
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("the page carries a CSRF token")
        .to_owned();
    (id, csrf)
}
