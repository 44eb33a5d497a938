//! `reckon healthcheck`: the container's health probe. The runtime image is distroless (no
//! shell, no curl), so the binary probes its own `/healthz`. Plain HTTP/1.0 on loopback is
//! all it needs: one request, one status line.

use anyhow::{Context, bail};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub async fn run(url: &str) -> anyhow::Result<()> {
    let rest = url
        .strip_prefix("http://")
        .context("healthcheck URL must start with http:// (the probe stays on loopback)")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, "/"),
    };
    let probe = async {
        let mut conn = tokio::net::TcpStream::connect(authority)
            .await
            .with_context(|| format!("cannot connect to {authority}"))?;
        conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n").as_bytes())
            .await?;
        let mut head = vec![0u8; 64];
        let n = conn.read(&mut head).await?;
        anyhow::Ok(String::from_utf8_lossy(&head[..n]).into_owned())
    };
    let head = tokio::time::timeout(Duration::from_secs(3), probe)
        .await
        .context("no answer within 3 s")??;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status == "200" {
        Ok(())
    } else {
        bail!(
            "unhealthy: {url} answered {:?}",
            head.lines().next().unwrap_or("")
        )
    }
}
