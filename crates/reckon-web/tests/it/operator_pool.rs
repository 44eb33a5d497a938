//! While background work holds every connection of the ledger's work pool (a backlog being
//! worked off), `/metrics`, `/readyz` and the dashboard still answer, from the operator's
//! pool; the API waits with the work.

use crate::common::{Backend, Req, World, send, session};
use axum::http::{Method, StatusCode};
use reckon_web::AppState;
use reckon_web::metrics::{Metrics, MetricsSettings, MetricsState};
use sqlx::Connection;
use std::time::Duration;

async fn the_operators_view_answers_while_the_work_pool_is_full(backend: Backend) {
    let pg = matches!(backend, Backend::Postgres);
    let w = World::new(backend).await;
    let mut state = AppState::new(w.ledger.clone());
    state.metrics = MetricsState::new(
        Metrics::new(),
        MetricsSettings::default().with_operator_token("operator"),
    );
    let app = reckon_web::app(state);
    let (cookie, _) = session(&app, "alice@acme.test").await;

    // Held outside reckon: every write to hourly snapshots waits, each on a connection of
    // the work's pool (PostgreSQL: the table locked against writes; SQLite: the write lock).
    let holder: Box<dyn std::any::Any + Send> = if pg {
        let (admin, db) = w.pg_database().unwrap();
        let url = format!("{}/{db}", admin.rsplit_once('/').unwrap().0);
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        sqlx::raw_sql("BEGIN; LOCK TABLE unresolved_snapshot IN EXCLUSIVE MODE")
            .execute(&mut conn)
            .await
            .unwrap();
        Box::new(conn)
    } else {
        let opts =
            sqlx::sqlite::SqliteConnectOptions::new().filename(w.data_dir().join("reckon.db"));
        let mut conn = sqlx::SqliteConnection::connect_with(&opts).await.unwrap();
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .unwrap();
        Box::new(conn)
    };
    let max = w.ledger.pool_status().max;
    let mut work = tokio::task::JoinSet::new();
    for _ in 0..(3 * max) {
        let (ledger, t) = (w.ledger.clone(), w.a.id);
        work.spawn(async move { ledger.take_snapshot(t, reckon_domain::time::now()).await });
    }
    let full = async {
        while w.ledger.pool_status().in_use < max {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), full)
        .await
        .expect("the background writes fill the work's pool");

    let get = |uri: &'static str, r: Req<'static>| {
        let app = app.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(3), send(&app, Method::GET, uri, r))
                .await
                .unwrap_or_else(|_| panic!("{uri} did not answer while the work's pool is full"))
        }
    };
    let token = Req {
        token: Some("operator"),
        ..Default::default()
    };
    let m = get("/metrics", token).await;
    assert_eq!(m.status, StatusCode::OK, "{}", m.text);
    assert!(
        m.text.contains("reckon_metrics_collector_up 1\n"),
        "the ledger's series are there:\n{}",
        m.text
    );
    let r = get("/readyz", Req::default()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // A signed-in page also writes (its session's use); on SQLite the lock held is the one
    // writer's, which no pool can get around, so the page is asked on PostgreSQL only.
    if !pg {
        drop(holder);
        while let Some(done) = work.join_next().await {
            done.unwrap().unwrap();
        }
        w.finish().await;
        return;
    }
    let page = send(
        &app,
        Method::GET,
        "/t/acme/queue",
        Req {
            cookie: Some(&cookie),
            ..Default::default()
        },
    );
    let page = tokio::time::timeout(Duration::from_secs(3), page)
        .await
        .expect("the dashboard answers while the work's pool is full");
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);

    drop(holder);
    while let Some(done) = work.join_next().await {
        done.unwrap().unwrap();
    }
    w.finish().await;
}

#[tokio::test]
async fn the_operators_view_answers_while_the_work_pool_is_full_sqlite() {
    the_operators_view_answers_while_the_work_pool_is_full(Backend::Sqlite).await;
}

#[tokio::test]
async fn the_operators_view_answers_while_the_work_pool_is_full_postgres() {
    the_operators_view_answers_while_the_work_pool_is_full(Backend::Postgres).await;
}
