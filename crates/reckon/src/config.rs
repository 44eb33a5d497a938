//! Settings, loaded once: defaults < `reckon.toml` < `RECKON_*` environment < flags.

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Clone, Deserialize, Serialize)]
pub struct Settings {
    /// `postgres://...` selects PostgreSQL; unset means the embedded SQLite file in
    /// `data_dir`.
    pub database_url: Option<String>,
    pub data_dir: PathBuf,
    /// Where `reckon serve` listens.
    pub listen: String,
    /// Base64 of 32 bytes; unset means a key file in `data_dir` (single node only).
    pub master_key: Option<String>,
    /// Largest request body the API accepts, in bytes.
    pub max_body_bytes: usize,
    // ---- metrics (issue 5): `/metrics` is off unless one of these is set ----
    /// A listener of its own serving `/metrics` without a token (`RECKON_METRICS_LISTEN`).
    pub metrics_listen: Option<String>,
    /// Bearer token that may read `/metrics` on the main listener (`RECKON_METRICS_TOKEN`).
    pub metrics_token: Option<String>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("database_url", &self.database_url.as_ref().map(|_| "<set>"))
            .field("data_dir", &self.data_dir)
            .field("listen", &self.listen)
            .field("master_key", &self.master_key.as_ref().map(|_| "<set>"))
            .field("metrics_listen", &self.metrics_listen)
            .field(
                "metrics_token",
                &self.metrics_token.as_ref().map(|_| "<set>"),
            )
            .finish()
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            database_url: None,
            data_dir: PathBuf::from("./reckon-data"),
            listen: "127.0.0.1:8080".into(),
            master_key: None,
            max_body_bytes: 8 * 1024 * 1024,
            metrics_listen: None,
            metrics_token: None,
        }
    }
}

/// Flags that override everything else.
#[derive(Default, Serialize)]
pub struct Overrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
}

impl Settings {
    pub fn load(config_file: &std::path::Path, overrides: Overrides) -> anyhow::Result<Settings> {
        let s: Settings = Figment::from(Serialized::defaults(Settings::default()))
            .merge(Toml::file(config_file))
            .merge(Env::prefixed("RECKON_"))
            .merge(Serialized::defaults(overrides))
            .extract()?;
        Ok(s)
    }
}
