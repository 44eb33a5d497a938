//! The one table of provider kinds: for each, its name for people, the secret it needs, how
//! its settings become an adapter, and what its settings say without a secret. Adding a
//! provider is its adapter module (with its settings), its word in
//! [`reckon_domain::ProviderKind`] and one line in [`adapter`] (the match is exhaustive, so
//! the compiler asks for that line).

use crate::settings::{RawSettings, SettingsError};
use crate::{GetClient, Provider};
use reckon_domain::ProviderKind;
use secrecy::SecretString;
use std::sync::Arc;

/// Builds a kind's adapter from its settings (read once by [`crate::settings::parse`]),
/// refusing settings the kind cannot work with.
pub type Build =
    fn(RawSettings, Option<SecretString>, GetClient) -> Result<Arc<dyn Provider>, SettingsError>;

/// What reckon knows about one kind of provider.
pub struct Adapter {
    pub kind: ProviderKind,
    /// The kind's name for people (pages, messages): `Stripe`, `HTTP lookup`, `Demo`.
    pub label: &'static str,
    /// The secret the kind cannot work without, described for the person adding it;
    /// `None`: a secret is optional.
    pub needs_secret: Option<&'static str>,
    pub build: Build,
    /// The kind's own refusals of what a person saves (beyond what [`Adapter::build`]
    /// refuses at every use), given the secret entered now, if any.
    pub check_at_save: fn(&RawSettings, Option<&str>) -> Result<(), SettingsError>,
    /// How long the provider keeps an idempotency key, from its settings alone (no secret).
    pub replay_window_secs: fn(&RawSettings) -> Option<f64>,
    /// Its lookup reads windows and is calibrated against the application's known outcomes
    /// (a lookup by key needs no calibration).
    pub calibrates: bool,
}

/// The adapter of a kind.
pub fn adapter(kind: ProviderKind) -> &'static Adapter {
    match kind {
        ProviderKind::Stripe => &crate::stripe::ADAPTER,
        ProviderKind::Http => &crate::http::ADAPTER,
        ProviderKind::Demo => &crate::demo::ADAPTER,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_entry() {
        for kind in ProviderKind::ALL {
            assert_eq!(adapter(kind).kind, kind);
        }
    }
}
