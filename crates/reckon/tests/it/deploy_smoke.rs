//! The deploy files run, not only lint: a throwaway PostgreSQL cluster with password
//! (scram-sha-256) authentication, made as compose.yaml's `postgres` service makes it (its
//! user, database and password), and two `reckon serve` replicas on it, one with the
//! environment compose.yaml gives its reckon services, one with what the Kubernetes
//! Deployment gives (its ConfigMap and the Secret's keys), after the migration step both
//! run first (compose's one-shot `migrate` service, the Deployment's init container), and
//! Grafana's admin password has no default. Both become ready and share the
//! reconciler's work: every effect looked at exactly once, by one replica or the other, each
//! taking some.
//!
//! Only what cannot be the same outside a container is substituted: the database's host and
//! port (the throwaway cluster's), each replica's listen ports (containers have a network
//! each; here they share loopback) and the data directory (a volume mount there). A
//! compose.yaml whose database URL lost its password fails here: the cluster refuses a
//! connection without one.
#![allow(
    clippy::string_slice,
    reason = "the texts sliced here are the tests' own ASCII: URLs, templates, tokens, HTTP heads"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn yaml(path: &str) -> serde_yaml_ng::Value {
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    let mut v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    // compose.yaml's services share one definition through `<<: *reckon`.
    v.apply_merge().unwrap();
    v
}

/// Compose's variable interpolation (`${VAR}`, `${VAR:-default}`, `${VAR:?error}`, `$$`),
/// from `vars` as `--env-file deploy/.env` would give them.
fn interpolate(s: &str, vars: &BTreeMap<&str, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        if let Some(r) = rest.strip_prefix('$') {
            out.push('$');
            rest = r;
            continue;
        }
        let Some(r) = rest.strip_prefix('{') else {
            return Err(format!("unsupported interpolation in {s:?}"));
        };
        let end = r
            .find('}')
            .ok_or_else(|| format!("unclosed ${{ in {s:?}"))?;
        let (expr, after) = (&r[..end], &r[end + 1..]);
        let value = vars
            .get(expr.split(':').next().unwrap())
            .filter(|v| !v.is_empty());
        let got = if let Some((_, default)) = expr.split_once(":-") {
            value.cloned().unwrap_or_else(|| default.to_owned())
        } else if let Some((name, why)) = expr.split_once(":?") {
            value
                .cloned()
                .ok_or_else(|| format!("{name} is required: {why}"))?
        } else {
            value.cloned().unwrap_or_default()
        };
        out.push_str(&got);
        rest = after;
    }
    out.push_str(rest);
    Ok(out)
}

/// `ENV` of the Dockerfile's final stage: the image's environment, under compose's.
fn dockerfile_env() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(root().join("deploy/Dockerfile")).unwrap();
    let last_stage = text.rsplit("\nFROM ").next().unwrap();
    let mut env = BTreeMap::new();
    let mut lines = last_stage.lines();
    while let Some(line) = lines.next() {
        let Some(first) = line.strip_prefix("ENV ") else {
            continue;
        };
        let mut words = vec![first.trim().trim_end_matches('\\').trim().to_owned()];
        let mut cont = line.trim_end().ends_with('\\');
        while cont {
            let next = lines.next().unwrap();
            cont = next.trim_end().ends_with('\\');
            words.push(next.trim().trim_end_matches('\\').trim().to_owned());
        }
        for w in words.iter().flat_map(|l| l.split_whitespace()) {
            let (k, v) = w.split_once('=').expect("ENV key=value");
            env.insert(k.to_owned(), v.to_owned());
        }
    }
    env
}

/// The installed PostgreSQL's programs (the newest major version).
fn pg_bin() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL's programs under /usr/lib/postgresql")
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .expect("initdb under /usr/lib/postgresql/*/bin")
        .1
}

fn is_root() -> bool {
    let out = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

/// PostgreSQL refuses to run as root: as root, its programs run as the `postgres` user.
fn as_postgres(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn run(mut c: Command, what: &str) -> String {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A PostgreSQL cluster of its own, stopped (immediately) when dropped, in a temporary
/// directory of its own that the `postgres` user owns (it cannot enter the test's).
struct Cluster {
    _dir: tempfile::TempDir,
    bin: PathBuf,
    data: PathBuf,
    sockets: PathBuf,
    port: u16,
}

impl Cluster {
    /// As the postgres image's entrypoint does it: `initdb` with the image's user as the
    /// bootstrap superuser and its password, scram-sha-256 for every TCP connection, then
    /// the image's database.
    fn start(user: &str, password: &str, database: &str) -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let bin = pg_bin();
        let data = dir.join("pgdata");
        let sockets = dir.join("sockets");
        std::fs::create_dir_all(&sockets).unwrap();
        let pwfile = dir.join("pwfile");
        std::fs::write(&pwfile, format!("{password}\n")).unwrap();
        if is_root() {
            run(
                {
                    let mut c = Command::new("chown");
                    c.args(["-R", "postgres:postgres"]).arg(dir);
                    c
                },
                "chown the cluster's directory to postgres",
            );
        }
        let mut initdb = as_postgres(&bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                user,
                "--auth-host=scram-sha-256",
                "--auth-local=trust",
            ])
            .args(["-E", "UTF8", "--no-sync", "--no-instructions"])
            .arg(format!("--pwfile={}", pwfile.display()));
        run(initdb, "initdb");
        let port = free_port();
        let mut ctl = as_postgres(&bin.join("pg_ctl"));
        ctl.arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(dir.join("postgres.log"))
            .arg("-o")
            .arg(format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
                sockets.display()
            ))
            .args(["-w", "-t", "60", "start"]);
        run(ctl, "pg_ctl start");
        let cluster = Cluster {
            _dir: tmp,
            bin,
            data,
            sockets,
            port,
        };
        let mut psql = as_postgres(&cluster.bin.join("psql"));
        psql.arg("-h")
            .arg(&cluster.sockets)
            .args(["-p", &port.to_string(), "-U", user, "-d", "postgres"])
            .args(["-v", "ON_ERROR_STOP=1", "-c"])
            .arg(format!("CREATE DATABASE \"{database}\""));
        run(psql, "create the database");
        cluster
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut ctl = as_postgres(&self.bin.join("pg_ctl"));
        ctl.arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"]);
        let _ = ctl.output();
    }
}

struct Replica {
    name: &'static str,
    child: Child,
    log: PathBuf,
    listen: u16,
    metrics: u16,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Replica {
    /// `reckon ARGS` with exactly `env` (nothing inherited but PATH), its log in a file.
    fn start(
        name: &'static str,
        dir: &Path,
        args: &[String],
        env: &BTreeMap<String, String>,
    ) -> Replica {
        let port = |key: &str| -> u16 {
            let addr = &env[key];
            addr.rsplit_once(':').unwrap().1.parse().unwrap()
        };
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_reckon"))
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start reckon");
        Replica {
            name,
            child,
            log,
            listen: port("RECKON_LISTEN"),
            metrics: port("RECKON_METRICS_LISTEN"),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn wait_ready(&mut self, deadline: Instant) {
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "{} exited ({status}) before it was ready:\n{}",
                    self.name,
                    self.log()
                );
            }
            if get(self.listen, "/readyz")
                .await
                .is_some_and(|(s, _)| s == 200)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready in time:\n{}",
                self.name,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The sum of one counter's samples on this replica's metrics listener.
    async fn counter(&self, name: &str, labels: &str) -> f64 {
        let (status, body) = get(self.metrics, "/metrics").await.expect("metrics");
        assert_eq!(status, 200);
        body.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(labels))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
            .sum()
    }
}

/// One HTTP/1.1 GET on loopback; `None` when nothing listens yet.
async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.ok()?;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n")?;
    Some((head.get(9..12)?.parse().ok()?, body.to_owned()))
}

/// compose.yaml's database URL, pointed at the throwaway cluster: only its host and port
/// change (they name the `postgres` service of compose's network).
fn at_cluster(url: &str, port: u16) -> String {
    let mut u = url::Url::parse(url).unwrap();
    assert_eq!(
        (u.host_str(), u.port()),
        (Some("postgres"), Some(5432)),
        "compose's RECKON_DATABASE_URL names its postgres service: {url}"
    );
    u.set_host(Some("127.0.0.1")).unwrap();
    u.set_port(Some(port)).unwrap();
    u.to_string()
}

/// A replica's own ports: the same address, another port (each container has its own).
fn own_ports(env: &mut BTreeMap<String, String>) {
    for key in ["RECKON_LISTEN", "RECKON_METRICS_LISTEN"] {
        let addr = env.get(key).unwrap_or_else(|| panic!("{key} is set"));
        let (host, _) = addr.rsplit_once(':').unwrap();
        let port = free_port();
        env.insert(key.to_owned(), format!("{host}:{port}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_with_the_deploy_environment_start_on_a_password_protected_postgres_and_share_the_work()
 {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    // deploy/.env as compose.yaml's header makes it.
    let password: String = (0..24)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect();
    let master_key = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 32]>())
    };
    let vars = BTreeMap::from([
        ("POSTGRES_PASSWORD", password.clone()),
        ("RECKON_MASTER_KEY", master_key.clone()),
    ]);

    let compose = yaml("deploy/compose.yaml");
    let service_env = |service: &str| -> BTreeMap<String, String> {
        compose["services"][service]["environment"]
            .as_mapping()
            .unwrap_or_else(|| panic!("compose.yaml's {service} has an environment mapping"))
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    serde_yaml_ng::Value::String(s) => s.clone(),
                    other => serde_yaml_ng::to_string(other).unwrap().trim().to_owned(),
                };
                (
                    k.as_str().unwrap().to_owned(),
                    interpolate(&v, &vars).unwrap(),
                )
            })
            .collect()
    };

    // The database, as compose's postgres service makes it.
    let pg = service_env("postgres");
    let (user, database) = (&pg["POSTGRES_USER"], &pg["POSTGRES_DB"]);
    assert_eq!(
        pg["POSTGRES_PASSWORD"], password,
        "the database's password is POSTGRES_PASSWORD"
    );
    let cluster = Cluster::start(user, &pg["POSTGRES_PASSWORD"], database);
    // The cluster asks for the password: a URL without one is refused.
    let no_password = format!("postgres://{user}@127.0.0.1:{}/{database}", cluster.port);
    let refused = sqlx::PgPool::connect(&no_password).await;
    assert!(
        refused.is_err(),
        "the throwaway cluster must require a password"
    );

    // Grafana's admin password is required: no stack opens with a known one.
    let grafana = compose["services"]["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
        .as_str()
        .unwrap();
    let refused = interpolate(grafana, &vars).expect_err("Grafana's password has a default");
    assert!(refused.contains("GRAFANA_ADMIN_PASSWORD"), "{refused}");

    // The migration step, before any replica: compose's one-shot `migrate` service, which
    // the replicas wait for (completed successfully), with the image's environment.
    let migrate = &compose["services"]["migrate"];
    assert_eq!(migrate["command"][0], "migrate");
    assert_eq!(migrate["restart"], "no");
    for replica in ["reckon-1", "reckon-2"] {
        assert_eq!(
            compose["services"][replica]["depends_on"]["migrate"]["condition"],
            "service_completed_successfully",
            "{replica} starts after the migrations"
        );
    }
    let mut env_migrate = dockerfile_env();
    env_migrate.extend(service_env("migrate"));
    let url = at_cluster(&env_migrate["RECKON_DATABASE_URL"], cluster.port);
    env_migrate.insert("RECKON_DATABASE_URL".into(), url.clone());
    env_migrate.insert(
        "RECKON_DATA_DIR".into(),
        dir.path().join("data-migrate").display().to_string(),
    );
    let migrated = Command::new(env!("CARGO_BIN_EXE_reckon"))
        .args(
            migrate["command"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap()),
        )
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(&env_migrate)
        .output()
        .unwrap();
    assert!(
        migrated.status.success(),
        "compose's migrate service: {}",
        String::from_utf8_lossy(&migrated.stderr)
    );

    // Replica 1: compose's reckon-1, over the image's environment (Dockerfile ENV), its
    // command the image's (`serve`).
    let mut env1 = dockerfile_env();
    env1.extend(service_env("reckon-1"));
    assert_eq!(
        at_cluster(&env1["RECKON_DATABASE_URL"], cluster.port),
        url,
        "the migrate service and the replicas share the ledger"
    );
    env1.insert("RECKON_DATABASE_URL".into(), url.clone());
    env1.insert(
        "RECKON_DATA_DIR".into(),
        dir.path().join("data-1").display().to_string(),
    );
    own_ports(&mut env1);
    assert_eq!(env1["RECKON_LOG_FORMAT"], "json");

    // Replica 2: the Kubernetes Deployment's container: the image's environment, the
    // ConfigMap's (envFrom), then its env entries, each from the Secret `reckon-secrets`
    // (which the operator creates: here, the same database and key), with its args.
    let deployment = yaml("deploy/k8s/base/deployment.yaml");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    // Its init container runs the migrations first, as the same image with the same
    // environment.
    let init = &deployment["spec"]["template"]["spec"]["initContainers"][0];
    assert_eq!(init["args"][0], "migrate");
    for field in ["image", "envFrom", "env", "securityContext", "volumeMounts"] {
        assert_eq!(
            init[field], container[field],
            "the init container's {field}"
        );
    }
    let configmap = yaml("deploy/k8s/base/configmap.yaml");
    let secret = BTreeMap::from([("database-url", url.clone()), ("master-key", master_key)]);
    let mut env2 = dockerfile_env();
    for from in container["envFrom"].as_sequence().unwrap() {
        assert_eq!(
            from["configMapRef"]["name"], configmap["metadata"]["name"],
            "the Deployment reads the ConfigMap"
        );
        for (k, v) in configmap["data"].as_mapping().unwrap() {
            env2.insert(
                k.as_str().unwrap().to_owned(),
                v.as_str().unwrap().to_owned(),
            );
        }
    }
    for e in container["env"].as_sequence().unwrap() {
        let name = e["name"].as_str().unwrap().to_owned();
        let value = match e["valueFrom"]["secretKeyRef"]["key"].as_str() {
            Some(key) => {
                assert_eq!(e["valueFrom"]["secretKeyRef"]["name"], "reckon-secrets");
                secret
                    .get(key)
                    .unwrap_or_else(|| panic!("the Secret has no key {key}"))
                    .clone()
            }
            None => e["value"].as_str().unwrap().to_owned(),
        };
        env2.insert(name, value);
    }
    env2.insert(
        "RECKON_DATA_DIR".into(),
        dir.path().join("data-2").display().to_string(),
    );
    own_ports(&mut env2);
    let args2: Vec<String> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();

    let mut r1 = Replica::start("compose reckon-1", dir.path(), &["serve".into()], &env1);
    let mut r2 = Replica::start("kubernetes Deployment", dir.path(), &args2, &env2);
    let deadline = Instant::now() + Duration::from_secs(120);
    r1.wait_ready(deadline).await;
    r2.wait_ready(deadline).await;
    eprintln!("both replicas ready after {:?}", started.elapsed());

    // Work for both: a tenant whose charges are routed to a provider. Neither deploy
    // environment allows egress to loopback or private addresses, so every lookup is
    // refused before it leaves (the provider is "misconfigured"): a quick answer that each
    // replica records as one indeterminate attempt, counted on its own metrics.
    let keyring = reckon_ledger::Keyring::from_base64(&env1["RECKON_MASTER_KEY"]).unwrap();
    let ledger = reckon_ledger::connect(Some(&url), &dir.path().join("cli"), keyring)
        .await
        .unwrap();
    let tenant = ledger.create_tenant("acme").await.unwrap();
    let source = ledger
        .add_source(
            tenant.id,
            reckon_ledger::NewSource {
                name: "shop".into(),
                kind: reckon_ledger::SourceKind::Push,
                dsn: None,
                dsn_display: None,
                table_name: "justonce_keys".into(),
                scan_interval_secs: 3600,
                abandoned_after_secs: 300.0,
                overlap_secs: 5.0,
                full_scan_every_secs: 3600,
                mapping: None,
            },
        )
        .await
        .unwrap();
    ledger
        .add_provider(
            tenant.id,
            reckon_ledger::NewProvider {
                name: "pay".into(),
                kind: reckon_ledger::ProviderKind::Http,
                secret: None,
                settings: serde_json::json!({ "base_url": "http://127.0.0.1:9/" }),
            },
        )
        .await
        .unwrap();
    ledger
        .set_route(tenant.id, "shop", "charge", Some("pay"))
        .await
        .unwrap();
    // In waves, a second apart: each replica's reconciler looks every 2 s, so both find
    // work whichever started first.
    const WAVES: usize = 6;
    const PER_WAVE: usize = 400;
    let created = reckon_domain::time::now() - 600.0;
    for wave in 0..WAVES {
        let records = (0..PER_WAVE)
            .map(|i| reckon_domain::SourceRecord {
                key: format!("charge:v1:ORD-{wave}-{i}"),
                state: reckon_domain::State::Unknown,
                request_hash: "1:9f86d081884c7d65".into(),
                response: None,
                attempts: 1,
                created_at: created,
                updated_at: created + 1.0,
                expires_at: None,
            })
            .collect();
        ledger
            .ingest(
                tenant.id,
                source.id,
                reckon_ledger::IngestBatch {
                    origin: reckon_ledger::Origin::Push,
                    observed_at: reckon_domain::time::now(),
                    records,
                    rejected: vec![],
                    abandoned_after_secs: 300.0,
                    cursor: None,
                    lease: None,
                    expect_new: false,
                },
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    let total = (WAVES * PER_WAVE) as f64;
    let labels = r#"outcome="indeterminate",provider="pay",tenant="acme""#;
    let deadline = Instant::now() + Duration::from_secs(120);
    let (n1, n2) = loop {
        let (n1, n2) = (
            r1.counter("reckon_reconcile_outcomes_total", labels).await,
            r2.counter("reckon_reconcile_outcomes_total", labels).await,
        );
        if n1 + n2 >= total {
            break (n1, n2);
        }
        assert!(
            Instant::now() < deadline,
            "{n1} + {n2} of {total} effects looked at in time:\n{}\n{}",
            r1.log(),
            r2.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    eprintln!("reckon-1 looked at {n1}, the Deployment's replica {n2}");
    assert_eq!(n1 + n2, total, "each effect looked at once");
    assert!(
        n1 > 0.0 && n2 > 0.0,
        "both replicas share the work: {n1} and {n2}"
    );
    // The ledger agrees: one attempt per effect, whoever made it.
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let (attempts, effects): (i64, i64) =
        sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT effect_id) FROM reconcile_attempt")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((attempts, effects), (total as i64, total as i64));
    pool.close().await;

    // Both still running, and both logged JSON lines as compose and the ConfigMap ask.
    for r in [&mut r1, &mut r2] {
        assert!(r.child.try_wait().unwrap().is_none(), "{} died", r.name);
        let log = r.log();
        assert!(log.lines().count() > 0);
        for line in log.lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: not a JSON line ({e}): {line}", r.name));
            assert!(v.get("level").is_some(), "{line}");
        }
    }
    drop((r1, r2));
    drop(cluster);
    eprintln!("deploy smoke test took {:?}", started.elapsed());
}
