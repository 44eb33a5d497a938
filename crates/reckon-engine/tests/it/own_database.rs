//! reckon's own database is refused by identity, not by address: a source connection that
//! can see the ledger's identity (`reckon_instance`, migration 0016) is closed before it
//! reads anything, whether it got there through a port forward the address check cannot
//! recognise (PostgreSQL), a server showing the identity row (MySQL), or a hard link to
//! the ledger file (SQLite). Sources that are not reckon's database scan as before.

#[allow(
    dead_code,
    reason = "a module shared by several test modules; not each uses all of it"
)]
use crate::common;

use common::{Kind, SourceDb, sqlite_root};
use reckon_engine::scan::open_source;
use reckon_engine::{ScanOptions, SourceInput, new_source, scan_source};
use reckon_ledger::{Keyring, Ledger, Source, Tenant, WritebackPolicy};
use reckon_sources::{EgressPolicy, OwnDatabase, SourceWriter, WriteError};
use sqlx::{AssertSqlSafe, Connection};
use std::sync::Arc;

const PG_ADMIN: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A TCP port forward on loopback to `target`: another address for the same server, as a
/// proxy, a tunnel or a second listen address would be.
async fn forward(target: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    port
}

async fn add(ledger: &dyn Ledger, tenant: &Tenant, name: &str, kind: &str, dsn: &str) -> Source {
    let new = new_source(SourceInput {
        name: name.into(),
        kind: kind.into(),
        dsn: Some(dsn.into()),
        table: None,
        scan_interval: None,
        abandoned_after: None,
        overlap: None,
        full_scan_every: None,
        mapping: None,
    })
    .unwrap();
    ledger.add_source(tenant.id, new).await.unwrap()
}

/// The policy `reckon serve` builds: loopback allowed (as in a single-host deployment),
/// reckon's own database by address, and by the ledger's identity.
async fn policy(ledger: &dyn Ledger, own: OwnDatabase) -> EgressPolicy {
    EgressPolicy::new(&["127.0.0.0/8".into(), "::1".into()], Some(sqlite_root()))
        .unwrap()
        .with_own_database(own)
        .with_own_identity(ledger.instance_identity().await.unwrap())
}

async fn writer_refused(ledger: &dyn Ledger, tenant: &Tenant, name: &str, egress: &EgressPolicy) {
    ledger
        .set_source_writeback(tenant.id, name, Some(WritebackPolicy::Release))
        .await
        .unwrap();
    let s = ledger.source_by_name(tenant.id, name).await.unwrap();
    let dsn = ledger.source_dsn(tenant.id, &s).await.unwrap();
    match SourceWriter::open(&s, &dsn, &egress.for_tenant(&tenant.slug)).await {
        Err(WriteError::Egress(e)) => assert!(e.contains("reckon's own database"), "{e}"),
        Err(e) => panic!("{name}: wrong refusal: {e}"),
        Ok(_) => panic!("{name}: a writer was opened on reckon's own database"),
    }
}

#[tokio::test]
async fn a_postgres_source_reaching_the_ledger_through_another_address_is_refused() {
    let db = format!("reckon_own_{:016x}", rand::random::<u64>());
    let mut admin = sqlx::PgConnection::connect(PG_ADMIN).await.unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE \"{db}\"")))
        .execute(&mut admin)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("postgres://postgres@127.0.0.1:5432/{db}");
    let ledger = reckon_ledger::connect(
        Some(&url),
        dir.path(),
        Keyring::from_base64(&Keyring::generate_base64()).unwrap(),
    )
    .await
    .unwrap();
    let tenant = ledger.create_tenant("acme").await.unwrap();
    let egress = policy(
        &*ledger,
        OwnDatabase::Network {
            host: "127.0.0.1".into(),
            port: 5432,
            database: db.clone(),
        },
    )
    .await;
    let port = forward("127.0.0.1:5432").await;

    // The ledger's own database through the forward: the address check cannot tell (another
    // port), the identity can. Superuser (trust) and an ordinary login without any grant
    // on reckon's tables alike: the identity is in a catalog every user reads.
    let role = format!("reckon_own_r{:08x}", rand::random::<u32>());
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE ROLE {role} LOGIN")))
        .execute(&mut admin)
        .await
        .unwrap();
    for (name, user) in [("own", "postgres"), ("own-nogrant", role.as_str())] {
        let s = add(
            &*ledger,
            &tenant,
            name,
            "postgres",
            &format!("postgres://{user}@127.0.0.1:{port}/{db}"),
        )
        .await;
        let err = match open_source(&*ledger, &tenant, &s, &egress).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{name}: a connection to reckon's own database was opened"),
        };
        assert!(err.contains("reckon's own database"), "{name}: {err}");
        let err = scan_source(
            &*ledger,
            &tenant,
            &s,
            &ScanOptions {
                egress: Arc::new(egress.clone()),
                ..ScanOptions::default()
            },
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains("reckon's own database"), "{name}: {err}");
        writer_refused(&*ledger, &tenant, name, &egress).await;
        // Without the identity (the address check alone) the same source gets through.
        let by_address = EgressPolicy::new(&["127.0.0.0/8".into()], None)
            .unwrap()
            .with_own_database(OwnDatabase::Network {
                host: "127.0.0.1".into(),
                port: 5432,
                database: db.clone(),
            });
        let s = ledger.source_by_name(tenant.id, name).await.unwrap();
        let conn = open_source(&*ledger, &tenant, &s, &by_address)
            .await
            .unwrap_or_else(|e| panic!("{name}: the forward itself failed: {e}"));
        conn.close().await;
    }

    // Another database of the same server, through the same forward, scans.
    let shop = SourceDb::fresh(Kind::Postgres).await;
    shop.writer(&["populate"]);
    let shop_db = shop.source_dsn.rsplit('/').next().unwrap().to_owned();
    let s = add(
        &*ledger,
        &tenant,
        "shop",
        "postgres",
        &format!("postgres://postgres@127.0.0.1:{port}/{shop_db}"),
    )
    .await;
    let report = scan_source(
        &*ledger,
        &tenant,
        &s,
        &ScanOptions {
            egress: Arc::new(egress.clone()),
            ..ScanOptions::default()
        },
    )
    .await
    .expect("another database of the same server scans");
    assert!(report.created > 0, "{report:?}");
    shop.drop_db().await;
    drop(ledger);
    for sql in [
        format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"),
        format!("DROP ROLE IF EXISTS {role}"),
    ] {
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_mysql_source_that_can_see_the_ledger_identity_is_refused() {
    let l = common::TestLedger::new().await;
    let egress = policy(
        &*l.ledger,
        OwnDatabase::File(std::path::PathBuf::from("/nonexistent")),
    )
    .await;
    let identity = l.ledger.instance_identity().await.unwrap();
    // A MariaDB database whose user can see a `reckon_instance` row holding the identity:
    // what any server showing reckon's ledger over the MySQL protocol would show.
    let seen = SourceDb::fresh(Kind::Mysql).await;
    seen.writer(&["populate"]);
    seen.exec(&[
        "CREATE TABLE reckon_instance (id INTEGER PRIMARY KEY, identity TEXT NOT NULL)".into(),
        format!("INSERT INTO reckon_instance VALUES (1, '{identity}')"),
    ])
    .await;
    let s = l.add_source("seen", "mysql", &seen.source_dsn).await;
    let err = match open_source(&*l.ledger, &l.tenant, &s, &egress).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a connection that sees reckon's identity was opened"),
    };
    assert!(err.contains("reckon's own database"), "{err}");
    writer_refused(&*l.ledger, &l.tenant, "seen", &egress).await;
    // A MySQL connection reads every database of the server its user may, so while that
    // one exists every source on this server is refused; without it, a database holding
    // another identity (another reckon's ledger) is scanned as usual.
    seen.drop_db().await;
    let other = SourceDb::fresh(Kind::Mysql).await;
    other.writer(&["populate"]);
    other
        .exec(&[
            "CREATE TABLE reckon_instance (id INTEGER PRIMARY KEY, identity TEXT NOT NULL)".into(),
            "INSERT INTO reckon_instance VALUES (1, 'reckon-ledger-someone-else')".into(),
        ])
        .await;
    let s = l.add_source("other", "mysql", &other.source_dsn).await;
    let report = scan_source(
        &*l.ledger,
        &l.tenant,
        &s,
        &ScanOptions {
            egress: Arc::new(egress.clone()),
            ..ScanOptions::default()
        },
    )
    .await
    .expect("a database without reckon's identity scans");
    assert!(report.created > 0, "{report:?}");
    other.drop_db().await;
}

#[tokio::test]
async fn a_hard_link_to_the_sqlite_ledger_is_refused() {
    let tenant_dir = sqlite_root().join(common::TENANT);
    std::fs::create_dir_all(&tenant_dir).unwrap();
    // A ledger on the same file system as the tenant's directory, so it can be linked.
    // It is closed (and its log checkpointed into the file) before the link is read: a
    // second name for a WAL database that is open elsewhere cannot be read at all.
    let dir = tempfile::tempdir_in(sqlite_root()).unwrap();
    let own = dir.path().join("reckon.db");
    let identity = {
        let ledger = reckon_ledger::connect(
            None,
            dir.path(),
            Keyring::from_base64(&Keyring::generate_base64()).unwrap(),
        )
        .await
        .unwrap();
        ledger.instance_identity().await.unwrap()
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", own.display()))
        .await
        .unwrap();
    sqlx::raw_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(&mut c)
        .await
        .unwrap();
    c.close().await.unwrap();
    let files = tempfile::tempdir_in(&tenant_dir).unwrap();
    let link = files.path().join("shop.db");
    std::fs::hard_link(&own, &link).unwrap();
    let dsn = reckon_sources::SourceDsn::Sqlite { path: link.clone() };

    let by_path = EgressPolicy::new(&[], Some(sqlite_root()))
        .unwrap()
        .with_own_database(OwnDatabase::File(own.clone()));
    let egress = by_path.clone().with_own_identity(identity);
    let pinned = egress.for_tenant(common::TENANT).pin(&dsn).await.unwrap();
    match reckon_sources::SourceConn::open(&pinned, "justonce_keys", &egress).await {
        Err(e) => assert!(e.to_string().contains("reckon's own database"), "{e}"),
        Ok(_) => panic!("a hard link to the ledger was opened"),
    }
    // A write-back writer for it (a source of another ledger, write-back on).
    let l = common::TestLedger::new().await;
    l.add_source("linked", "sqlite", link.to_str().unwrap())
        .await;
    writer_refused(&*l.ledger, &l.tenant, "linked", &egress).await;
    // The path check alone does not recognise the link.
    let pinned = by_path.for_tenant(common::TENANT).pin(&dsn).await.unwrap();
    let conn = reckon_sources::SourceConn::open(&pinned, "justonce_keys", &by_path)
        .await
        .expect("the path check alone opens the link");
    conn.close().await;
}
