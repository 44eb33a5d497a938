//! Secrets at rest (tenants' DSNs, providers' keys) are sealed with
//! XChaCha20-Poly1305 under the master key. The associated data binds each ciphertext to
//! its tenant and its row, so a ciphertext copied to another tenant or field fails to
//! open instead of leaking. XChaCha's 192-bit nonce makes random nonces safe.

pub mod files;

use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;
use std::path::Path;
use std::sync::Arc;

const VERSION: u8 = 1;

#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    #[error("RECKON_MASTER_KEY must be 32 bytes, base64-encoded (got {0} bytes)")]
    BadLength(usize),
    #[error("RECKON_MASTER_KEY is not valid base64")]
    BadBase64,
    #[error("could not read or create the master key file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// The master key. Its `Debug` never shows the key.
#[derive(Clone)]
pub struct Keyring {
    cipher: Arc<XChaCha20Poly1305>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keyring(<redacted>)")
    }
}

impl Keyring {
    pub fn from_base64(b64: &str) -> Result<Keyring, KeyringError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|_| KeyringError::BadBase64)?;
        Keyring::from_bytes(&bytes)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Keyring, KeyringError> {
        if bytes.len() != 32 {
            return Err(KeyringError::BadLength(bytes.len()));
        }
        Ok(Keyring {
            cipher: Arc::new(XChaCha20Poly1305::new(bytes.into())),
        })
    }

    /// A fresh random key, for tests and for the embedded default's key file.
    pub fn generate_base64() -> String {
        let mut key = [0u8; 32];
        rand::rng().fill_bytes(&mut key);
        base64::engine::general_purpose::STANDARD.encode(key)
    }

    /// The embedded default: a key file in the data directory, created (mode 0600) on
    /// first start. Several replicas must share RECKON_MASTER_KEY instead.
    pub fn load_or_create_file(path: &Path) -> Result<Keyring, KeyringError> {
        let io = |source| KeyringError::Io {
            path: path.display().to_string(),
            source,
        };
        match std::fs::read_to_string(path) {
            Ok(s) => Keyring::from_base64(&s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = Keyring::generate_base64();
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir).map_err(io)?;
                }
                write_private(path, key.as_bytes()).map_err(io)?;
                Keyring::from_base64(&key)
            }
            Err(e) => Err(io(e)),
        }
    }

    /// The key in a key file, or `None` when there is no such file.
    pub fn load_file(path: &Path) -> Result<Option<Keyring>, KeyringError> {
        match std::fs::read_to_string(path) {
            Ok(s) => Keyring::from_base64(&s).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(KeyringError::Io {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    /// Write a base64 key to a new file readable by its owner only (never overwrites).
    pub fn write_file(path: &Path, key_b64: &str) -> Result<(), KeyringError> {
        let io = |source| KeyringError::Io {
            path: path.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent() {
            crate::files::create_private_dir(dir).map_err(io)?;
        }
        write_private(path, key_b64.as_bytes()).map_err(io)
    }

    pub fn seal(&self, aad: &str, plaintext: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; 24];
        rand::rng().fill_bytes(&mut nonce);
        let sealed = self
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plaintext,
                    aad: aad.as_bytes(),
                },
            )
            .expect("XChaCha20-Poly1305 encryption cannot fail for in-memory buffers");
        let mut out = Vec::with_capacity(1 + 24 + sealed.len());
        out.push(VERSION);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    pub fn open(&self, aad: &str, sealed: &[u8]) -> Option<Vec<u8>> {
        if sealed.len() < 1 + 24 + 16 || sealed[0] != VERSION {
            return None;
        }
        self.cipher
            .decrypt(
                XNonce::from_slice(&sealed[1..25]),
                Payload {
                    msg: &sealed[25..],
                    aad: aad.as_bytes(),
                },
            )
            .ok()
    }
}

#[cfg(unix)]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

#[cfg(not(unix))]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

/// The associated data for a source's DSN.
pub fn dsn_aad(tenant_id: i64, source_name: &str) -> String {
    format!("reckon/v1|tenant:{tenant_id}|source:{source_name}|dsn")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ciphertext_opens_only_with_its_own_binding_and_key() {
        let k = Keyring::from_base64(&Keyring::generate_base64()).unwrap();
        let sealed = k.seal(&dsn_aad(1, "shop"), b"postgres://u:canary@h/db");
        assert_eq!(
            k.open(&dsn_aad(1, "shop"), &sealed).unwrap(),
            b"postgres://u:canary@h/db"
        );
        assert!(
            k.open(&dsn_aad(2, "shop"), &sealed).is_none(),
            "other tenant"
        );
        assert!(k.open(&dsn_aad(1, "other"), &sealed).is_none(), "other row");
        let mut flipped = sealed.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(k.open(&dsn_aad(1, "shop"), &flipped).is_none(), "tampered");
        let other = Keyring::from_base64(&Keyring::generate_base64()).unwrap();
        assert!(
            other.open(&dsn_aad(1, "shop"), &sealed).is_none(),
            "wrong key"
        );
        assert!(!String::from_utf8_lossy(&sealed).contains("canary"));
    }

    #[test]
    fn bad_keys_are_refused() {
        assert!(matches!(
            Keyring::from_base64("c2hvcnQ="),
            Err(KeyringError::BadLength(5))
        ));
        assert!(matches!(
            Keyring::from_base64("!!"),
            Err(KeyringError::BadBase64)
        ));
    }
}
