//! Passwords: argon2id with the argon2 crate's defaults (m = 19 MiB, t = 2, p = 1, the OWASP
//! recommendation), stored as PHC strings. Hashing is CPU-heavy, so it runs on the blocking
//! pool, at most [`HASH_PERMITS`] at a time: a flood of sign-ins queues here instead of
//! starving the async executor that serves everyone else.

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use secrecy::{ExposeSecret, SecretString};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::Semaphore;

/// Concurrent hashes; the machine this targets has two cores.
pub const HASH_PERMITS: usize = 2;
pub const MIN_LEN: usize = 12;
pub const MAX_LEN: usize = 256;

static PERMITS: LazyLock<Semaphore> = LazyLock::new(|| Semaphore::new(HASH_PERMITS));

/// Verifications made by this process: a known and an unknown email must each cost one.
static VERIFICATIONS: AtomicU64 = AtomicU64::new(0);

/// How many password verifications this process has made (for tests and benches that
/// check sign-in takes the same steps whoever is named).
pub fn verifications() -> u64 {
    VERIFICATIONS.load(Ordering::Relaxed)
}

/// A hash of a password nobody has, verified when the email is unknown so that a wrong
/// email takes as long as a wrong password (no account discovery by timing).
static DUMMY: LazyLock<String> = LazyLock::new(|| hash_blocking("no such user, never a password"));

/// Refuse passwords that are too short or absurdly long; no composition rules (ASVS 6.2).
pub fn check_policy(password: &str) -> Result<(), String> {
    let n = password.chars().count();
    if n < MIN_LEN {
        return Err(format!("a password needs at least {MIN_LEN} characters"));
    }
    if n > MAX_LEN {
        return Err(format!("a password may have at most {MAX_LEN} characters"));
    }
    Ok(())
}

/// Hash on the current thread (the CLI; tests).
pub fn hash_blocking(password: &str) -> String {
    let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("argon2 with default parameters cannot fail")
        .to_string()
}

pub async fn hash(password: SecretString) -> String {
    let _permit = PERMITS.acquire().await.expect("never closed");
    tokio::task::spawn_blocking(move || hash_blocking(password.expose_secret()))
        .await
        .expect("hashing does not panic")
}

/// Does `password` match `phc`? `None` for `phc` checks against a dummy hash and says no.
pub async fn verify(password: SecretString, phc: Option<String>) -> bool {
    let _permit = PERMITS.acquire().await.expect("never closed");
    tokio::task::spawn_blocking(move || {
        let known = phc.is_some();
        let phc = phc.unwrap_or_else(|| DUMMY.clone());
        let Ok(parsed) = PasswordHash::new(&phc) else {
            return false;
        };
        let ok = Argon2::default()
            .verify_password(password.expose_secret().as_bytes(), &parsed)
            .is_ok();
        VERIFICATIONS.fetch_add(1, Ordering::Relaxed);
        known && ok
    })
    .await
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hash_is_argon2id_and_verifies_only_its_password() {
        let h = hash(SecretString::from("correct horse battery")).await;
        assert!(h.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{h}");
        assert!(!h.contains("correct horse"));
        assert!(verify(SecretString::from("correct horse battery"), Some(h.clone())).await);
        assert!(!verify(SecretString::from("correct horse batterx"), Some(h)).await);
        assert!(!verify(SecretString::from("no such user, never a password"), None).await);
    }

    #[test]
    fn the_policy_counts_characters() {
        assert!(check_policy("short").is_err());
        assert!(check_policy("twelve chars").is_ok());
        assert!(check_policy(&"x".repeat(257)).is_err());
    }
}
