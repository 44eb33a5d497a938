//! T13: a rogue MySQL server. A tenant's DSN may point at a server the tenant controls,
//! and such a server can ask the client for more than a scan should give: a file of
//! reckon's host (`LOAD DATA LOCAL INFILE`: the server answers a query with a 0xFB packet
//! naming a path) or the DSN's password in clear text (an auth switch to
//! `mysql_clear_password`). Here a loopback server speaking the MySQL protocol plays both
//! tricks against the connection a scan opens (`SourceConn::open`, options built field by
//! field from the DSN) and records every byte the client sends: the connection fails, the
//! file's bytes and the clear-text password are never sent, and the client never even
//! offers LOCAL INFILE (no `CLIENT_LOCAL_FILES` capability).

use reckon_sources::{Dialect, SourceConn, SourceDsn};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PASSWORD: &str = "canary-mysql-pw-4e1d";
const CLIENT_LOCAL_FILES: u32 = 128;

#[derive(Clone, Copy)]
enum Trick {
    ClearTextAuth,
    LocalInfile,
}

#[derive(Default, Debug)]
struct Seen {
    /// Every byte the client sent.
    bytes: Vec<u8>,
    /// The capability flags of each handshake response.
    capabilities: Vec<u32>,
    /// Tricks played (the client got that far).
    played: usize,
}

fn packet(seq: u8, body: &[u8]) -> Vec<u8> {
    let len = body.len() as u32;
    let mut p = len.to_le_bytes()[..3].to_vec();
    p.push(seq);
    p.extend_from_slice(body);
    p
}

fn read_packet(s: &mut TcpStream, seen: &Mutex<Seen>) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 4];
    s.read_exact(&mut head)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], 0]) as usize;
    let mut body = vec![0; len];
    s.read_exact(&mut body)?;
    let mut seen = seen.lock().unwrap();
    seen.bytes.extend_from_slice(&head);
    seen.bytes.extend_from_slice(&body);
    Ok((head[3], body))
}

/// Whatever else the client sends within a moment, then the connection is closed.
fn drain(s: &mut TcpStream, seen: &Mutex<Seen>) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(1500)));
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        seen.lock().unwrap().bytes.extend_from_slice(&buf[..n]);
    }
}

/// A MariaDB-looking v10 handshake: native password auth, LOCAL INFILE offered by the
/// server, no TLS.
fn handshake() -> Vec<u8> {
    let caps: u32 = 1
        | 2
        | 4
        | 8
        | CLIENT_LOCAL_FILES
        | 512
        | 8192
        | 32768
        | (1 << 16)
        | (1 << 17)
        | (1 << 19)
        | (1 << 21)
        | (1 << 24);
    let mut b = vec![10];
    b.extend_from_slice(b"5.5.5-10.11.6-MariaDB\0");
    b.extend_from_slice(&7u32.to_le_bytes());
    b.extend_from_slice(b"abcdefgh\0");
    b.extend_from_slice(&(caps as u16).to_le_bytes());
    b.push(45); // utf8mb4_general_ci
    b.extend_from_slice(&2u16.to_le_bytes()); // autocommit
    b.extend_from_slice(&((caps >> 16) as u16).to_le_bytes());
    b.push(21);
    b.extend_from_slice(&[0; 10]);
    b.extend_from_slice(b"ijklmnopqrst\0");
    b.extend_from_slice(b"mysql_native_password\0");
    b
}

fn serve_one(
    mut s: TcpStream,
    trick: Trick,
    file: &str,
    seen: &Mutex<Seen>,
) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(&packet(0, &handshake()))?;
    let (_, response) = read_packet(&mut s, seen)?;
    let caps = u32::from_le_bytes(response[..4].try_into().unwrap());
    seen.lock().unwrap().capabilities.push(caps);
    match trick {
        Trick::ClearTextAuth => {
            let mut switch = vec![0xfe];
            switch.extend_from_slice(b"mysql_clear_password\0");
            // Counted before the write: the client may fail on the packet and the test
            // read `played` before this thread runs again.
            seen.lock().unwrap().played += 1;
            s.write_all(&packet(2, &switch))?;
        }
        Trick::LocalInfile => {
            // Authenticated: OK.
            s.write_all(&packet(2, &[0, 0, 0, 2, 0, 0, 0]))?;
            // The first query (the client's session settings, or the scan's own) is
            // answered with a LOCAL INFILE request for `file`.
            let (_, query) = read_packet(&mut s, seen)?;
            assert_eq!(query[0], 0x03, "a COM_QUERY");
            let mut infile = vec![0xfb];
            infile.extend_from_slice(file.as_bytes());
            seen.lock().unwrap().played += 1;
            s.write_all(&packet(1, &infile))?;
        }
    }
    drain(&mut s, seen);
    Ok(())
}

/// Start the rogue server; returns its port and what it saw.
fn rogue(trick: Trick, file: String) -> (u16, Arc<Mutex<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let _ = serve_one(conn, trick, &file, &s);
        }
    });
    (port, seen)
}

async fn open(port: u16) -> Result<SourceConn, String> {
    let dsn = SourceDsn::parse(
        Dialect::Mysql,
        &format!("mysql://shop:{PASSWORD}@127.0.0.1:{port}/orders"),
    )
    .unwrap();
    match tokio::time::timeout(
        Duration::from_secs(30),
        SourceConn::open(
            &dsn,
            "justonce_keys",
            &reckon_sources::EgressPolicy::default(),
        ),
    )
    .await
    {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err("the test's own 30 s bound passed".into()),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn a_rogue_server_asking_for_a_local_file_gets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret.txt");
    const CONTENT: &str = "canary-file-content-71c2 root:x:0:0";
    std::fs::write(&file, CONTENT).unwrap();
    let (port, seen) = rogue(Trick::LocalInfile, file.to_str().unwrap().to_owned());
    let result = open(port).await;
    let err = result
        .err()
        .expect("the connection to a rogue server fails");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.played, 1, "the server never got to ask: {err}");
    assert!(!seen.capabilities.is_empty());
    for caps in &seen.capabilities {
        assert_eq!(
            caps & CLIENT_LOCAL_FILES,
            0,
            "the client offered LOCAL INFILE"
        );
    }
    assert!(
        !contains(&seen.bytes, b"canary-file-content"),
        "the client sent the file"
    );
    assert!(!err.contains(PASSWORD), "{err}");
}

#[tokio::test]
async fn a_rogue_server_asking_for_the_password_in_clear_text_gets_nothing() {
    let (port, seen) = rogue(Trick::ClearTextAuth, String::new());
    let result = open(port).await;
    let err = result
        .err()
        .expect("the connection to a rogue server fails");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.played, 1, "the server never got to ask: {err}");
    assert!(
        !contains(&seen.bytes, PASSWORD.as_bytes()),
        "the client sent the password in clear text"
    );
    assert!(!err.contains(PASSWORD), "{err}");
}
