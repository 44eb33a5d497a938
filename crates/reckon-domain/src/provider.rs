use serde::{Deserialize, Serialize};

// Stored and sent as its word (`stripe`, `http`, `demo`), so ledgers written before the
// type existed read back unchanged. What each kind does (its adapter, how its settings are
// read, its name for people) is one entry of `reckon_providers::registry`. The doc line
// below is the API document's description.
/// The kinds of provider reckon can ask.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    // Stripe's API, read with a restricted read-only key.
    Stripe,
    // A tenant's own system speaking reckon's http provider protocol.
    Http,
    // The built-in demo provider (the http protocol, on loopback).
    Demo,
}

/// A word that is not a provider kind; the message lists the kinds there are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("provider kind {0:?} is unknown: use {list}", list = ProviderKind::list())]
pub struct UnknownProviderKind(pub String);

impl ProviderKind {
    pub const ALL: [ProviderKind; 3] =
        [ProviderKind::Stripe, ProviderKind::Http, ProviderKind::Demo];

    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Stripe => "stripe",
            ProviderKind::Http => "http",
            ProviderKind::Demo => "demo",
        }
    }

    /// The kind spelled exactly `s` (as stored, as typed), or an error naming the kinds.
    pub fn parse(s: &str) -> Result<ProviderKind, UnknownProviderKind> {
        ProviderKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownProviderKind(s.to_owned()))
    }

    /// Every kind's word, for messages and forms: `stripe, http or demo`.
    pub fn list() -> String {
        let words: Vec<&str> = ProviderKind::ALL.iter().map(|k| k.as_str()).collect();
        match words.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => words.concat(),
        }
    }
}

impl std::fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ProviderKind {
    type Err = UnknownProviderKind;

    fn from_str(s: &str) -> Result<ProviderKind, UnknownProviderKind> {
        ProviderKind::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_from_its_stored_word_and_json_keeps_the_word() {
        for k in ProviderKind::ALL {
            assert_eq!(ProviderKind::parse(k.as_str()), Ok(k));
            let json = serde_json::to_value(k).unwrap();
            assert_eq!(json, serde_json::Value::String(k.as_str().to_owned()));
            assert_eq!(serde_json::from_value::<ProviderKind>(json).unwrap(), k);
        }
        assert_eq!(
            serde_json::to_string(&ProviderKind::Stripe).unwrap(),
            "\"stripe\""
        );
    }

    #[test]
    fn an_unknown_kind_is_refused_naming_the_kinds_there_are() {
        let e = ProviderKind::parse("Stripe").unwrap_err();
        assert_eq!(e, UnknownProviderKind("Stripe".into()));
        assert_eq!(
            e.to_string(),
            "provider kind \"Stripe\" is unknown: use stripe, http or demo"
        );
        assert!(ProviderKind::parse("adyen").is_err());
    }
}
