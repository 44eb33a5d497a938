//! What came from a provider (bodies, error messages, evidence) is stored and shown to people
//! of lower roles than the admin who configured it. A provider that echoes the credential
//! it was sent ("Invalid API key provided: rk_live_...") must not get it stored. The
//! [`Redactor`] replaces the secrets the request carried and the common credential shapes
//! (Stripe's secret, restricted and webhook keys, reckon's own tokens, `Bearer` / `Basic`
//! values) before anything is stored, and the ledger scrubs what was stored before it
//! existed with the same rules.

use serde_json::Value;

/// What a secret is replaced with.
pub const MARK: &str = "[redacted]";

/// Secrets shorter than this are replaced only where they are a whole string: replacing
/// every occurrence of a short secret would mangle words, and would tell whoever can read
/// the text where the secret occurred.
const MIN_SUBSTRING: usize = 8;

/// Prefixes of credentials whatever their tenant (Stripe secret, restricted and webhook
/// keys; reckon's API tokens).
const SHAPES: &[&str] = &[
    "sk_live_", "sk_test_", "rk_live_", "rk_test_", "whsec_", "rkn_",
];

/// Schemes of an `Authorization` value whose credential follows.
const SCHEMES: &[&str] = &["Bearer ", "bearer ", "Basic ", "basic "];

#[derive(Debug, Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

fn token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '~' | '+' | '/' | '=')
}

impl Redactor {
    /// A redactor for the secrets one request carried (a provider's key, an auth header's
    /// value; its credential after a scheme counts too).
    pub fn new<I, S>(secrets: I) -> Redactor
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut out: Vec<String> = Vec::new();
        for s in secrets {
            let s = s.as_ref().trim();
            if s.is_empty() {
                continue;
            }
            out.push(s.to_owned());
            for scheme in SCHEMES {
                if let Some(rest) = s.strip_prefix(scheme) {
                    out.push(rest.trim().to_owned());
                }
            }
        }
        // Longest first, so a secret that contains another is replaced whole.
        out.sort_by_key(|s| std::cmp::Reverse(s.len()));
        out.dedup();
        Redactor { secrets: out }
    }

    /// `text` with every known secret and credential shape replaced by [`MARK`].
    pub fn text(&self, text: &str) -> String {
        let mut s = text.to_owned();
        for secret in &self.secrets {
            if secret.len() >= MIN_SUBSTRING {
                s = s.replace(secret.as_str(), MARK);
            } else if s == *secret {
                s = MARK.to_owned();
            }
        }
        for prefix in SHAPES {
            s = replace_tokens(&s, prefix, false);
        }
        for scheme in SCHEMES {
            s = replace_tokens(&s, scheme, true);
        }
        s
    }

    /// Every string of `v` (values and object keys) redacted in place.
    pub fn json(&self, v: &mut Value) {
        match v {
            Value::String(s) => {
                let r = self.text(s);
                if r != *s {
                    *s = r;
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.json(x)),
            Value::Object(m) => {
                let keys: Vec<String> = m.keys().cloned().collect();
                for k in keys {
                    let mut x = m.remove(&k).unwrap_or(Value::Null);
                    self.json(&mut x);
                    m.insert(self.text(&k), x);
                }
            }
            _ => {}
        }
    }
}

/// Replace each `prefix` followed by at least 8 token characters: the credential (and,
/// unless `keep_prefix`, the prefix) becomes [`MARK`].
#[allow(
    clippy::string_slice,
    reason = "every index is where `find` found the prefix, plus whole characters' lengths"
)]
fn replace_tokens(s: &str, prefix: &str, keep_prefix: bool) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(prefix) {
        let after = &rest[i + prefix.len()..];
        let len: usize = after
            .chars()
            .take_while(|c| token_char(*c))
            .map(char::len_utf8)
            .sum();
        // The prefix must start a word: `desk_test_` is not a Stripe key.
        let starts_word = rest[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !c.is_ascii_alphanumeric() && c != '_');
        out.push_str(&rest[..i]);
        if len >= 8 && starts_word {
            if keep_prefix {
                out.push_str(prefix);
            }
            out.push_str(MARK);
        } else {
            out.push_str(&rest[i..i + prefix.len() + len]);
        }
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_echoed_key_is_replaced_wherever_it_stands() {
        let r = Redactor::new(["rk_live_51HxYzAbCdEf"]);
        assert_eq!(
            r.text("Invalid API Key provided: rk_live_51HxYzAbCdEf"),
            "Invalid API Key provided: [redacted]"
        );
        let mut v = json!({"error": {"message": "key rk_live_51HxYzAbCdEf, again rk_live_51HxYzAbCdEf"},
                           "rk_live_51HxYzAbCdEf": 1, "n": 3});
        r.json(&mut v);
        assert_eq!(
            v,
            json!({"error": {"message": "key [redacted], again [redacted]"},
                   "[redacted]": 1, "n": 3})
        );
    }

    #[test]
    fn credential_shapes_are_replaced_without_knowing_them() {
        let r = Redactor::default();
        assert_eq!(
            r.text("got sk_test_4eC39HqLyjWDarjtT1zdp7dc and whsec_abcdefgh12 from rkn_0123456789abcdef"),
            "got [redacted] and [redacted] from [redacted]"
        );
        assert_eq!(
            r.text("Authorization: Bearer abc.def-ghi_jkl"),
            "Authorization: Bearer [redacted]"
        );
        // Too short to be a key, or inside another word: left alone.
        assert_eq!(r.text("mode sk_test_ only"), "mode sk_test_ only");
        assert_eq!(r.text("desk_test_abcdefghijk"), "desk_test_abcdefghijk");
    }

    #[test]
    fn an_auth_headers_credential_counts_without_its_scheme() {
        let r = Redactor::new(["Token s3cr3t-value-42"]);
        assert_eq!(r.text("echo: Token s3cr3t-value-42"), "echo: [redacted]");
        let r = Redactor::new(["Bearer s3cr3t-value-42"]);
        assert_eq!(r.text("you sent s3cr3t-value-42"), "you sent [redacted]");
    }

    #[test]
    fn a_short_secret_is_replaced_only_as_a_whole_string() {
        let r = Redactor::new(["p4ss"]);
        assert_eq!(r.text("p4ss"), MARK);
        assert_eq!(
            r.text("egress p4sslicy p4ss"),
            "egress p4sslicy p4ss",
            "no mangled words, no oracle"
        );
    }
}
