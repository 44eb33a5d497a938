//! Operation keys: `operation:version:part[:part...]`, as justonce's `operation_key()`
//! builds them. Applications may use any key (a client's Idempotency-Key header, say), so
//! parsing is best-effort and the raw key is always kept beside what was parsed.

use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OperationKey {
    pub operation: String,
    pub version: String,
    /// Everything after the version, `:` included (parts may contain `:`).
    pub subject: String,
    /// The subject split on `:`; lookups match any single part exactly.
    pub parts: Vec<String>,
}

impl OperationKey {
    /// Parse a key of the form `operation:vN:part[:part...]`. Returns `None` for keys of
    /// any other shape: an operation must be a plain word, the version `v` plus digits,
    /// and no part may be empty (justonce refuses empty parts, so a key with one was not
    /// built by `operation_key()`).
    pub fn parse(key: &str) -> Option<OperationKey> {
        let mut it = key.splitn(3, ':');
        let operation = it.next()?;
        let version = it.next()?;
        let subject = it.next()?;
        let word = |s: &str| {
            !s.is_empty()
                && s.len() <= 128
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
        };
        let version_ok = version.len() >= 2
            && version.len() <= 10
            && version
                .strip_prefix('v')
                .is_some_and(|n| n.chars().all(|c| c.is_ascii_digit()));
        if !word(operation) || !version_ok || subject.is_empty() {
            return None;
        }
        let parts: Vec<String> = subject.split(':').map(str::to_owned).collect();
        if parts.iter().any(String::is_empty) {
            return None;
        }
        Some(OperationKey {
            operation: operation.to_owned(),
            version: version.to_owned(),
            subject: subject.to_owned(),
            parts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_library_shape() {
        let k = OperationKey::parse("charge:v1:order_123").unwrap();
        assert_eq!(k.operation, "charge");
        assert_eq!(k.version, "v1");
        assert_eq!(k.subject, "order_123");
        assert_eq!(k.parts, vec!["order_123"]);
    }

    #[test]
    fn parts_may_contain_colons() {
        let k = OperationKey::parse("refund:v2:cus_9:ORD-17").unwrap();
        assert_eq!(k.version, "v2");
        assert_eq!(k.subject, "cus_9:ORD-17");
        assert_eq!(k.parts, vec!["cus_9", "ORD-17"]);
    }

    #[test]
    fn other_shapes_are_kept_raw() {
        for key in [
            "3f2b8c1e-9a4d-4c1b-8e7f-0a1b2c3d4e5f",
            "charge",
            "charge:v1",
            "charge:v1:",
            "charge:version1:x",
            "charge:v1:a::b",
            ":v1:x",
            "char ge:v1:x",
        ] {
            assert_eq!(OperationKey::parse(key), None, "{key}");
        }
    }

    #[test]
    fn unicode_and_quotes_survive_in_the_subject() {
        let k = OperationKey::parse("charge:v1:o'r\";DROP TABLE x;--").unwrap();
        assert_eq!(k.subject, "o'r\";DROP TABLE x;--");
        let k = OperationKey::parse("charge:v1:ORD-ü-日本").unwrap();
        assert_eq!(k.subject, "ORD-ü-日本");
    }
}
