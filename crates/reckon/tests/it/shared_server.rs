//! One tenant's provider or one client cannot take the shared server down for everyone,
//! shown on a real `reckon serve` process:
//!
//! - a provider answering 64 MB grows the server's peak memory (VmHWM) by far less than the
//!   answer: it is read up to the cap and refused;
//! - with the process held to 512 descriptors (`ulimit -n`) and more idle connections opened
//!   than it has descriptors, `/healthz` still answers;
//! - an idle connection, and a keep-alive connection after its request, is closed after the
//!   header deadline.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MB: u64 = 1024 * 1024;

fn reckon(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_reckon"));
    c.arg("--data-dir")
        .arg(data)
        .env("RECKON_LOG", "warn")
        .env_remove("RECKON_DATABASE_URL")
        .env_remove("RECKON_MASTER_KEY")
        .env_remove("RECKON_MAX_CONNECTIONS")
        .env_remove("RECKON_MAX_PROVIDER_ANSWER_BYTES")
        .env("RECKON_EGRESS_ALLOW", r#"["127.0.0.1/32"]"#);
    c
}

fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run reckon");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `reckon serve` on loopback, under `ulimit -n nofile`, with `env` set.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(data: &Path, nofile: u32, env: &[(&str, &str)]) -> Server {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let cmd = reckon(data);
        let inner = cmd.get_program().to_owned();
        let args: Vec<_> = cmd.get_args().map(ToOwned::to_owned).collect();
        let mut sh = Command::new("sh");
        // `exec`: the child's pid is reckon's own (its /proc/PID/status is read below).
        sh.arg("-c")
            .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
            .arg(inner)
            .args(args)
            .args(["serve", "--listen", &addr.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => sh.env(k, v),
                None => sh.env_remove(k),
            };
        }
        for (k, v) in env {
            sh.env(k, v);
        }
        let child = sh.spawn().expect("spawn reckon serve");
        let s = Server { child, addr };
        for _ in 0..300 {
            if s.get("/healthz", Duration::from_secs(2)).is_ok() {
                return s;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("reckon serve did not come up on {addr}");
    }

    /// The process's peak resident memory (`VmHWM`), in bytes.
    fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc/PID/status");
        kb * 1024
    }

    /// One request on a fresh connection: the whole answer, or why there was none.
    fn get(&self, path: &str, patience: Duration) -> std::io::Result<String> {
        request(self.addr, "GET", path, None, patience)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    patience: Duration,
) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, patience)?;
    s.set_read_timeout(Some(patience))?;
    s.set_write_timeout(Some(patience))?;
    let auth = token.map_or_else(String::new, |t| format!("authorization: Bearer {t}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: reckon\r\n{auth}content-length: 0\r\nconnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    if out.is_empty() {
        return Err(std::io::Error::other("closed without an answer"));
    }
    Ok(out)
}

/// A provider that answers its first request with a small error body and every later one
/// with `size` bytes, streamed chunked; counts the bytes it got out.
async fn hostile_provider(size: u64) -> (String, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        let mut n = 0u32;
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            n += 1;
            let size = if n == 1 { 1024 } else { size };
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 8192];
                let _ = sock.read(&mut buf).await;
                let head = "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n\
                            transfer-encoding: chunked\r\nconnection: close\r\n\r\n";
                if sock.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let piece = vec![b' '; 256 * 1024];
                let mut left = size;
                while left > 0 {
                    let k = left.min(piece.len() as u64) as usize;
                    let mut chunk = format!("{k:x}\r\n").into_bytes();
                    chunk.extend_from_slice(&piece[..k]);
                    chunk.extend_from_slice(b"\r\n");
                    if sock.write_all(&chunk).await.is_err() {
                        return;
                    }
                    counter.fetch_add(k as u64, Ordering::SeqCst);
                    left -= k as u64;
                }
                let _ = sock.write_all(b"0\r\n\r\n").await;
            });
        }
    });
    (format!("http://{addr}/"), sent)
}

/// A tenant with an admin token and an `http` provider at `base`; the token.
fn tenant_with_provider(data: &Path, base: &str) -> String {
    ok(reckon(data).args(["tenant", "create", "acme"]));
    let token = ok(reckon(data).args(["token", "create", "--tenant", "acme", "--role", "admin"]));
    ok(reckon(data).args([
        "provider",
        "add",
        "--tenant",
        "acme",
        "--name",
        "hostile",
        "--kind",
        "http",
        "--settings",
        &serde_json::json!({ "base_url": base, "rate_per_sec": 0 }).to_string(),
    ]));
    token.trim().to_owned()
}

/// The answer cap of this test (2 MiB, set through RECKON_MAX_PROVIDER_ANSWER_BYTES).
const CAP: &str = "2097152";
/// Peak memory grows by less than this when a provider answers 64 MB. With a 2 MiB cap it
/// grew by about 20 MiB (buffers, the allocator's slack); reading the answer whole, as
/// before the cap, grew it by 208 MiB.
const GROWTH_BOUND: u64 = 48 * MB;

#[tokio::test(flavor = "multi_thread")]
async fn a_provider_answering_64_mb_does_not_grow_the_server_past_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (base, sent) = hostile_provider(64 * MB).await;
    let token = tenant_with_provider(&data, &base);
    let server = Server::start(&data, 1024, &[("RECKON_MAX_PROVIDER_ANSWER_BYTES", CAP)]);
    let addr = server.addr;
    let probe = {
        let token = token.clone();
        move || {
            request(
                addr,
                "POST",
                "/api/v1/providers/hostile/test",
                Some(&token),
                Duration::from_secs(60),
            )
            .expect("the provider test answers")
        }
    };
    // The first test (a small error) warms up what any lookup builds (TLS, the pool).
    let first = tokio::task::spawn_blocking(probe.clone()).await.unwrap();
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let before = server.peak_rss();

    let answer = tokio::task::spawn_blocking(probe).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains("answer too large"),
        "the test says why: {answer}"
    );
    let after = server.peak_rss();
    let growth = after.saturating_sub(before);
    assert!(
        growth < GROWTH_BOUND,
        "peak memory grew by {} MiB ({} -> {} MiB); the provider got {} MiB out",
        growth / MB,
        before / MB,
        after / MB,
        sent.load(Ordering::SeqCst) / MB
    );
    // And the server is still there for everyone.
    let h = server.get("/healthz", Duration::from_secs(10)).unwrap();
    assert!(h.starts_with("HTTP/1.1 200"), "{h}");
}

#[test]
fn healthz_answers_with_more_idle_connections_open_than_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    ok(reckon(&data).args(["tenant", "create", "acme"]));
    // Idle connections are kept for two minutes here: the cap, not the idle deadline, is
    // what is shown.
    // 256 descriptors: what the server accepts under its cap plus what the listen backlog
    // holds comes well past it (with 512, the two came to about 500 on a loaded machine).
    let server = Server::start(&data, 256, &[("RECKON_HEADER_READ_TIMEOUT_SECS", "120")]);
    let mut held = Vec::new();
    for _ in 0..600 {
        // Past the backlog a connect may not complete; what is held is enough.
        if let Ok(s) = TcpStream::connect_timeout(&server.addr, Duration::from_secs(2)) {
            held.push(s);
        }
    }
    assert!(held.len() > 256, "only {} connections opened", held.len());
    // Give the server time to take what it takes.
    std::thread::sleep(Duration::from_secs(1));
    for path in ["/healthz", "/readyz"] {
        let r = server
            .get(path, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{path} did not answer with the table full: {e}"));
        assert!(r.starts_with("HTTP/1.1 200"), "{path}: {r}");
    }
    // An API request over the cap is refused, not queued forever.
    let r = server.get("/api/v1/effects", Duration::from_secs(30));
    if let Ok(r) = r {
        assert!(
            r.starts_with("HTTP/1.1 503") || r.starts_with("HTTP/1.1 401"),
            "{r}"
        );
    }
    drop(held);
}

#[test]
fn idle_connections_are_closed_after_the_header_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    ok(reckon(&data).args(["tenant", "create", "acme"]));
    let server = Server::start(&data, 1024, &[("RECKON_HEADER_READ_TIMEOUT_SECS", "1")]);
    // Nothing sent at all.
    let mut silent = TcpStream::connect(server.addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = silent
        .read(&mut buf)
        .expect("closed by the server, not left open");
    assert_eq!(n, 0, "{}", String::from_utf8_lossy(&buf[..n]));

    // A keep-alive connection after its answer.
    let mut kept = TcpStream::connect(server.addr).unwrap();
    kept.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: reckon\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    loop {
        let n = kept
            .read(&mut buf)
            .expect("closed by the server, not left open");
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.ends_with("ok"), "one answer, then the close: {got}");
}
