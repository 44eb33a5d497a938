//! T14: canary secrets through a whole scenario. A MariaDB source
//! whose DSN carries a recognisable password, an `http` provider with a recognisable key on
//! a loopback server, an API token and a dashboard session: add them, use them (a scan, a
//! reconcile), fail with them (wrong port, wrong password, the provider answering 401 and
//! 500), edit them; then no canary may appear in any captured log line (a TRACE-level
//! subscriber over every crate, `log` records included), any API answer, HTML page or error
//! message, `/metrics` or `/api/v1/metrics`, and the ledger holds them only sealed: the
//! columns are ciphertext and a raw dump of every table (SQLite: the database file and its
//! WAL, byte for byte) contains none. On both ledgers.

#[path = "it/common/mod.rs"]
mod common;

use axum::http::{Method, StatusCode};
use common::{Backend, Reply, Req, World, send, sign_in};
use reckon_web::metrics::{MetricsSettings, MetricsState};
use reckon_web::{AppState, app};
use serde_json::{Value, json};
use sha2::Digest;
use sqlx::{AssertSqlSafe, Connection, Row};
use std::io::Write;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

const DSN_PASSWORD: &str = "pwCanaryDsn7Q";
const WRONG_PASSWORD: &str = "pwCanaryWrong3X";
const PROVIDER_KEY: &str = "rkCanaryKey9Z";
const PROVIDER_KEY_2: &str = "rkCanaryKey2W";
const METRICS_TOKEN: &str = "opCanaryMetrics5";

// Every log line of the test process, at TRACE.

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logs() -> &'static Captured {
    static LOGS: OnceLock<Captured> = OnceLock::new();
    LOGS.get_or_init(|| {
        let captured = Captured::default();
        let writer = captured.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            // `try_init` also routes the `log` crate's records here.
            .try_init()
            .expect("the only subscriber of this test binary");
        captured
    })
}

// A provider on loopback that answers what it is told and keeps what it was sent.

#[derive(Clone)]
struct FakeProvider {
    status: Arc<AtomicU16>,
    seen_headers: Arc<Mutex<Vec<String>>>,
}

async fn fake_provider() -> (FakeProvider, String) {
    let fake = FakeProvider {
        status: Arc::new(AtomicU16::new(401)),
        seen_headers: Arc::default(),
    };
    let f = fake.clone();
    let router = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let f = f.clone();
        async move {
            for v in req.headers().values() {
                f.seen_headers
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(v.as_bytes()).into_owned());
            }
            let status = StatusCode::from_u16(f.status.load(Ordering::SeqCst)).unwrap();
            (status, "{\"error\": \"no\"}")
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.ok() });
    (fake, format!("http://{addr}/"))
}

// A MariaDB source database reachable only with the canary password.

const MYSQL_ADMIN: &str = "mysql://root@127.0.0.1:3306/test";

/// The fixture's own connection: its statements (which hold the password, to create the
/// user) are not logged, so the capture holds only what reckon logged.
async fn admin_connection() -> sqlx::MySqlConnection {
    use sqlx::ConnectOptions;
    use std::str::FromStr;
    sqlx::mysql::MySqlConnectOptions::from_str(MYSQL_ADMIN)
        .unwrap()
        .disable_statement_logging()
        .connect()
        .await
        .expect("MariaDB must be running for this test")
}

struct MysqlSource {
    db: String,
    user: String,
}

impl MysqlSource {
    async fn create() -> MysqlSource {
        let n = rand::random::<u32>();
        let db = format!("reckon_canary_{n:08x}");
        let user = format!("canary_{n:08x}");
        let mut c = admin_connection().await;
        let now = reckon_domain::time::now() - 600.0;
        for stmt in [
            format!("CREATE DATABASE `{db}`"),
            format!("CREATE USER '{user}'@'%' IDENTIFIED BY '{DSN_PASSWORD}'"),
            format!("CREATE USER '{user}'@'localhost' IDENTIFIED BY '{DSN_PASSWORD}'"),
            format!("GRANT SELECT ON `{db}`.* TO '{user}'@'%'"),
            format!("GRANT SELECT ON `{db}`.* TO '{user}'@'localhost'"),
            format!(
                "CREATE TABLE `{db}`.justonce_keys (`key` varchar(255) PRIMARY KEY, \
                 state varchar(32) NOT NULL, request_hash varchar(255) NOT NULL, \
                 response longtext, attempts int NOT NULL, created_at double NOT NULL, \
                 updated_at double NOT NULL, expires_at double) DEFAULT CHARSET=utf8mb4"
            ),
            format!(
                "INSERT INTO `{db}`.justonce_keys VALUES ('charge:v1:ORD-1', 'unknown', 'h', \
                 NULL, 1, {now}, {now}, NULL)"
            ),
        ] {
            sqlx::raw_sql(AssertSqlSafe(stmt))
                .execute(&mut c)
                .await
                .unwrap();
        }
        c.close().await.ok();
        MysqlSource { db, user }
    }

    fn dsn(&self, password: &str, port: u16) -> String {
        format!(
            "mysql://{}:{password}@127.0.0.1:{port}/{}",
            self.user, self.db
        )
    }

    async fn drop(self) {
        let mut c = admin_connection().await;
        for stmt in [
            format!("DROP DATABASE IF EXISTS `{}`", self.db),
            format!("DROP USER IF EXISTS '{}'@'%'", self.user),
            format!("DROP USER IF EXISTS '{}'@'localhost'", self.user),
        ] {
            sqlx::raw_sql(AssertSqlSafe(stmt))
                .execute(&mut c)
                .await
                .ok();
        }
    }
}

/// Everything a person or a client could read back, with where it came from.
#[derive(Default)]
struct Seen(Vec<(String, String)>);

impl Seen {
    fn reply(&mut self, what: &str, r: &Reply) {
        let mut text = r.text.clone();
        for (name, value) in &r.headers {
            text.push_str(&format!(
                "\n{name}: {}",
                String::from_utf8_lossy(value.as_bytes())
            ));
        }
        self.0.push((what.to_owned(), text));
    }
    fn text(&mut self, what: &str, text: String) {
        self.0.push((what.to_owned(), text));
    }
}

async fn call(
    w: &World,
    app: &axum::Router,
    method: Method,
    uri: &str,
    body: Option<Value>,
) -> Reply {
    send(
        app,
        method,
        uri,
        Req {
            token: Some(&w.token_a),
            content_type: body.as_ref().map(|_| "application/json"),
            body: body.map(|b| b.to_string()).unwrap_or_default(),
            ..Default::default()
        },
    )
    .await
}

async fn scan(w: &World, seen: &mut Seen, what: &str) -> bool {
    let egress = reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None).unwrap();
    let opts = reckon_engine::ScanOptions {
        egress: Arc::new(egress),
        full: true,
        ..Default::default()
    };
    let source = w.ledger.source_by_name(w.a.id, "shop").await.unwrap();
    let r = reckon_engine::scan_source(w.ledger.as_ref(), &w.a, &source, &opts).await;
    seen.text(what, format!("{r:?}"));
    if let Err(e) = &r {
        seen.text(what, e.to_string());
    }
    r.is_ok()
}

/// Every table of the ledger as text, read as its owner (no row-level security), or the
/// SQLite file and its WAL as bytes.
async fn ledger_dump(w: &World) -> Vec<u8> {
    match w.pg_database() {
        None => {
            let mut out = Vec::new();
            for f in ["reckon.db", "reckon.db-wal"] {
                if let Ok(b) = std::fs::read(w.data_dir().join(f)) {
                    out.extend(b);
                }
            }
            out
        }
        Some((admin, db)) => {
            let url = reckon_testkit::with_database(admin, db);
            let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
            let tables: Vec<String> = sqlx::query_scalar(
                "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'",
            )
            .fetch_all(&mut c)
            .await
            .unwrap();
            assert!(tables.len() > 10, "{tables:?}");
            let mut out = Vec::new();
            for t in tables {
                let rows = sqlx::query(AssertSqlSafe(format!("SELECT t::text FROM \"{t}\" t")))
                    .fetch_all(&mut c)
                    .await
                    .unwrap();
                for r in rows {
                    out.extend(r.get::<String, _>(0).into_bytes());
                    out.push(b'\n');
                }
            }
            c.close().await.ok();
            out
        }
    }
}

async fn sealed_columns(w: &World) -> Vec<Vec<u8>> {
    let q = "SELECT dsn_ciphertext FROM source WHERE dsn_ciphertext IS NOT NULL \
             UNION ALL SELECT secret_ciphertext FROM provider WHERE secret_ciphertext IS NOT NULL";
    match w.pg_database() {
        None => {
            let opts = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(w.data_dir().join("reckon.db"))
                .read_only(true);
            let mut c = sqlx::SqliteConnection::connect_with(&opts).await.unwrap();
            sqlx::query_scalar(q).fetch_all(&mut c).await.unwrap()
        }
        Some((admin, db)) => {
            let mut c = sqlx::PgConnection::connect(&reckon_testkit::with_database(admin, db))
                .await
                .unwrap();
            sqlx::query_scalar(q).fetch_all(&mut c).await.unwrap()
        }
    }
}

async fn scenario(backend: Backend) {
    let logs = logs();
    let w = World::new(backend).await;
    let source_db = MysqlSource::create().await;
    let (fake, base_url) = fake_provider().await;
    let egress = reckon_sources::EgressPolicy::new(&["127.0.0.0/8".to_owned()], None).unwrap();
    let metrics = MetricsState::new(
        reckon_metrics::Metrics::new(),
        MetricsSettings {
            operator_token_sha256: Some(sha2::Sha256::digest(METRICS_TOKEN).into()),
            ..Default::default()
        },
    );
    let app = app(AppState {
        egress: Arc::new(egress),
        metrics,
        ..AppState::new(w.ledger.clone())
    });
    let mut seen = Seen::default();

    // Add the source and the provider, route charges to it.
    let r = call(
        &w,
        &app,
        Method::POST,
        "/api/v1/sources",
        Some(json!({"name": "shop", "kind": "mysql", "dsn": source_db.dsn(DSN_PASSWORD, 3306)})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    seen.reply("add source", &r);
    let r = call(
        &w,
        &app,
        Method::POST,
        "/api/v1/providers",
        Some(
            json!({"name": "inhouse", "kind": "http", "secret": PROVIDER_KEY,
                    "settings": {"base_url": base_url}}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    seen.reply("add provider", &r);
    let r = call(
        &w,
        &app,
        Method::PUT,
        "/api/v1/routes",
        Some(json!({"source": "shop", "operation": "charge", "provider": "inhouse"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // Use them: a scan that logs in with the password; lookups that send the key and get
    // 401, then 500.
    assert!(scan(&w, &mut seen, "scan").await, "{:?}", seen.0.last());
    let effect = "/api/v1/effects/shop/charge%3Av1%3AORD-1";
    for status in [401, 500] {
        fake.status.store(status, Ordering::SeqCst);
        let r = call(&w, &app, Method::POST, &format!("{effect}/reconcile"), None).await;
        seen.reply(&format!("reconcile ({status})"), &r);
        assert!(!r.status.is_server_error(), "{}", r.text);
        // "Test" the provider: its listing sends the key and fails the same way.
        let r = call(
            &w,
            &app,
            Method::POST,
            "/api/v1/providers/inhouse/test",
            None,
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert_eq!(r.json["ok"], false, "{}", r.text);
        seen.reply(&format!("test provider ({status})"), &r);
    }
    assert!(
        fake.seen_headers
            .lock()
            .unwrap()
            .iter()
            .any(|h| h.contains(PROVIDER_KEY)),
        "the provider was never sent the key"
    );

    // Fail to connect: a closed port, then a wrong password (both canaries).
    let patch = |body: Value| call(&w, &app, Method::PATCH, "/api/v1/sources/shop", Some(body));
    let r = patch(json!({"dsn": source_db.dsn(DSN_PASSWORD, 1)})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    seen.reply("edit source (port)", &r);
    assert!(!scan(&w, &mut seen, "scan, closed port").await);
    let probe = |what: &'static str| {
        let (w, app) = (&w, &app);
        async move {
            let r = call(w, app, Method::POST, "/api/v1/sources/shop/test", None).await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            assert_eq!(r.json["ok"], false, "{what}: {}", r.text);
            r
        }
    };
    seen.reply("test connection, closed port", &probe("closed port").await);
    let r = patch(json!({"dsn": source_db.dsn(WRONG_PASSWORD, 3306)})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    seen.reply("edit source (password)", &r);
    assert!(!scan(&w, &mut seen, "scan, wrong password").await);
    seen.reply(
        "test connection, wrong password",
        &probe("wrong password").await,
    );
    // A refused edit quoting a password.
    let r =
        patch(json!({"dsn": format!("{}?passfile=/x", source_db.dsn(DSN_PASSWORD, 3306))})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    seen.reply("refused edit", &r);
    // Back to the right password, given alone; the other fields edited keep it.
    let r = patch(json!({"password": DSN_PASSWORD})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = patch(json!({"scan_interval": "2m"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    seen.reply("edit source (interval)", &r);
    assert!(
        scan(&w, &mut seen, "scan again").await,
        "{:?}",
        seen.0.last()
    );

    // Edit the provider: a new key, then settings only (the key stays).
    let r = call(
        &w,
        &app,
        Method::PATCH,
        "/api/v1/providers/inhouse",
        Some(json!({"secret": PROVIDER_KEY_2})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    seen.reply("edit provider key", &r);
    let r = call(
        &w,
        &app,
        Method::PATCH,
        "/api/v1/providers/inhouse",
        Some(json!({"settings": {"base_url": base_url, "visibility_lag_secs": 30}})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    seen.reply("edit provider settings", &r);
    fake.status.store(500, Ordering::SeqCst);
    let r = call(&w, &app, Method::POST, &format!("{effect}/reconcile"), None).await;
    seen.reply("reconcile with the new key", &r);
    assert!(
        fake.seen_headers
            .lock()
            .unwrap()
            .iter()
            .any(|h| h.contains(PROVIDER_KEY_2)),
        "the provider was never sent the new key"
    );

    // Read everything back: JSON, metrics, the dashboard's pages.
    for uri in [
        "/api/v1/sources",
        "/api/v1/providers",
        "/api/v1/routes",
        "/api/v1/audit-log",
        "/api/v1/effects?source=shop",
        effect,
        "/api/v1/metrics",
        "/api/v1/tokens",
        "/api/v1/sources/nope/quarantine",
    ] {
        let r = call(&w, &app, Method::GET, uri, None).await;
        seen.reply(uri, &r);
    }
    let r = send(
        &app,
        Method::GET,
        "/metrics",
        Req {
            token: Some(METRICS_TOKEN),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("reckon_"), "{}", r.text);
    seen.reply("/metrics", &r);
    let signed_in = sign_in(&app, "alice@acme.test", common::PASSWORD, &[]).await;
    let session = signed_in.session_cookie().expect("a session");
    for uri in [
        "/app",
        "/t/acme",
        "/t/acme/settings",
        "/t/acme/queue",
        "/t/acme/effects/shop/charge%3Av1%3AORD-1",
        "/t/acme/lookup?q=ORD-1",
        "/t/acme/nope",
        "/t/globex/settings",
    ] {
        let r = send(
            &app,
            Method::GET,
            uri,
            Req {
                cookie: Some(&session),
                ..Default::default()
            },
        )
        .await;
        seen.reply(uri, &r);
    }
    let settings_page = &seen
        .0
        .iter()
        .find(|(w, _)| w == "/t/acme/settings")
        .unwrap()
        .1;
    assert!(settings_page.contains("shop"), "{settings_page}");

    let canaries = [
        DSN_PASSWORD,
        WRONG_PASSWORD,
        PROVIDER_KEY,
        PROVIDER_KEY_2,
        METRICS_TOKEN,
        w.token_a.as_str(),
        session.as_str(),
    ];
    let log_text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(
        log_text.contains("shop") || log_text.contains("http"),
        "the subscriber captured nothing"
    );
    for canary in canaries {
        for line in log_text.lines() {
            assert!(!line.contains(canary), "a log line holds a canary: {line}");
        }
        for (what, text) in &seen.0 {
            assert!(!text.contains(canary), "{what} holds a canary: {text}");
        }
    }
    // The ledger: sealed columns are ciphertext, and no table holds a canary in clear
    // (sessions and tokens are stored as hashes).
    let sealed = sealed_columns(&w).await;
    assert_eq!(sealed.len(), 2, "one DSN and one provider key");
    let dump = ledger_dump(&w).await;
    assert!(dump.len() > 1000);
    for canary in canaries {
        let c = canary.as_bytes();
        for blob in sealed.iter().chain([&dump]) {
            assert!(
                !blob.windows(c.len()).any(|win| win == c),
                "the ledger holds {canary} in clear"
            );
        }
    }
    source_db.drop().await;
    w.finish().await;
}

#[tokio::test]
async fn canary_secrets_never_leave_their_ciphertext_on_sqlite() {
    scenario(Backend::Sqlite).await;
}

#[tokio::test]
async fn canary_secrets_never_leave_their_ciphertext_on_postgres() {
    scenario(Backend::Postgres).await;
}
