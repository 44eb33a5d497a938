//! A provider's answer is read up to a cap and no further: one tenant's provider answering
//! 64 MB (an error body, a list page) must not take the shared server's memory. Served by
//! a raw HTTP server on loopback that streams its body and counts what it managed to send.
//! An answer over the cap is an indeterminate attempt ("answer too large", with the size
//! seen), never a verdict and never parsed.

use reckon_providers::{
    FaultKind, GetClient, LookupQuery, Outcome, Provider, build_provider, classify,
};
use secrecy::SecretString;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MB: u64 = 1024 * 1024;
const CAP: usize = 1024 * 1024;

/// A server answering every request with `status` and a body of `size` bytes of JSON-ish
/// filler, streamed in 64 KiB writes, chunked (`declared`: false) or with its length
/// declared up front. Returns its base URL and the bytes of body it got out before the
/// client stopped reading.
async fn hostile(status: u16, size: u64, declared: bool) -> (String, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = sock.read(&mut buf).await;
                let head = if declared {
                    format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {size}\r\n\r\n"
                    )
                } else {
                    format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
                    )
                };
                if sock.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let piece = vec![b' '; 64 * 1024];
                let mut left = size;
                while left > 0 {
                    let n = left.min(piece.len() as u64) as usize;
                    let ok = if declared {
                        sock.write_all(&piece[..n]).await
                    } else {
                        let mut chunk = format!("{n:x}\r\n").into_bytes();
                        chunk.extend_from_slice(&piece[..n]);
                        chunk.extend_from_slice(b"\r\n");
                        sock.write_all(&chunk).await
                    };
                    if ok.is_err() {
                        return;
                    }
                    counter.fetch_add(n as u64, Ordering::SeqCst);
                    left -= n as u64;
                }
                if !declared {
                    let _ = sock.write_all(b"0\r\n\r\n").await;
                }
            });
        }
    });
    (format!("http://{addr}"), sent)
}

fn client() -> GetClient {
    GetClient::new(Duration::from_secs(20)).with_max_answer_bytes(CAP)
}

fn stripe(base: &str) -> Arc<dyn Provider> {
    build_provider(
        reckon_providers::ProviderKind::Stripe,
        &json!({
            "base_url": base, "mode": "test", "use_search": false, "use_events": false,
            "list_objects": ["charges"], "rate_per_sec": 0, "visibility_lag_secs": 60,
            "max_call_secs": 10, "skew_secs": 5
        }),
        Some(SecretString::from("sk_test_cap".to_owned())),
        client(),
    )
    .unwrap()
}

fn http(base: &str) -> Arc<dyn Provider> {
    build_provider(
        reckon_providers::ProviderKind::Http,
        &json!({ "base_url": base, "rate_per_sec": 0, "visibility_lag_secs": 0 }),
        None,
        client(),
    )
    .unwrap()
}

fn old_effect() -> LookupQuery {
    let now = reckon_providers::now();
    LookupQuery {
        key: "charge:v1:order_64mb".into(),
        created_at: now - 3601.0,
        updated_at: now - 3600.0,
        expires_at: None,
        response_json: None,
        now,
        observed_at: None,
    }
}

/// Waits until the server has stopped writing (the client dropped the connection and the
/// server's write failed, or it finished), and returns what it got out.
async fn settled(sent: &AtomicU64) -> u64 {
    let mut last = u64::MAX;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = sent.load(Ordering::SeqCst);
        if now == last {
            return now;
        }
        last = now;
    }
}

#[tokio::test]
async fn a_64_mb_error_body_is_refused_past_the_cap_as_an_indeterminate_attempt() {
    let (base, sent) = hostile(500, 64 * MB, false).await;
    let q = old_effect();
    let report = stripe(&base).lookup(&q).await;
    let c = classify(&report, q.now);
    assert_eq!(c.outcome, Outcome::Indeterminate, "{c:?}");
    let f = &c.faults[0];
    assert_eq!(f.kind, FaultKind::TooLarge, "{f:?}");
    assert!(f.detail.contains("answer too large"), "{}", f.detail);
    assert!(f.detail.contains(&CAP.to_string()), "{}", f.detail);
    assert!(f.detail.contains("bytes were read"), "{}", f.detail);
    // The rest was never read: what the server got out is the cap plus what the socket
    // buffers held when the client hung up, far from 64 MB.
    let out = settled(&sent).await;
    assert!(
        out < 24 * MB,
        "the client read on: {out} bytes left the server"
    );
}

#[tokio::test]
async fn a_declared_length_over_the_cap_is_refused_before_the_body_is_read() {
    let (base, _sent) = hostile(200, 64 * MB, true).await;
    let q = old_effect();
    let report = http(&base).lookup(&q).await;
    let c = classify(&report, q.now);
    assert_eq!(c.outcome, Outcome::Indeterminate, "{c:?}");
    let f = &c.faults[0];
    assert_eq!(f.kind, FaultKind::TooLarge, "{f:?}");
    assert!(
        f.detail.contains(&(64 * MB).to_string()),
        "the declared size is told: {}",
        f.detail
    );
}

#[tokio::test]
async fn an_answer_under_the_cap_is_read_whole() {
    // The control: the same server with a body under the cap gives the ordinary answer
    // (here a 500 whose body is not JSON: a server error, not a size refusal).
    let (base, _sent) = hostile(500, CAP as u64 / 2, false).await;
    let q = old_effect();
    let report = stripe(&base).lookup(&q).await;
    let c = classify(&report, q.now);
    assert_eq!(c.outcome, Outcome::Indeterminate, "{c:?}");
    assert_eq!(c.faults[0].kind, FaultKind::ServerError, "{c:?}");
}

#[tokio::test]
async fn a_listing_page_over_the_cap_fails_the_listing_with_its_size() {
    let (base, _sent) = hostile(200, 64 * MB, false).await;
    let now = reckon_providers::now();
    let failure = http(&base)
        .list_charges(now - 86_400.0, now)
        .await
        .expect_err("a page over the cap is no listing");
    assert_eq!(failure.fault.kind, FaultKind::TooLarge, "{failure:?}");
    assert!(
        failure.to_string().contains("answer too large"),
        "{failure}"
    );
}
