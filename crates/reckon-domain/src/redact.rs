//! What came from a provider (bodies, error messages, evidence) is stored and shown to people
//! of lower roles than the admin who configured it. A provider that echoes the credential
//! it was sent ("Invalid API key provided: rk_live_...") must not get it stored. The
//! [`Redactor`] replaces the secrets the request carried and the common credential shapes
//! (Stripe's secret, restricted and webhook keys, reckon's own tokens, `Bearer` / `Basic`
//! values) before anything is stored, and the ledger scrubs what was stored before it
//! existed with the same rules.
//!
//! A provider (or a proxy, a WAF, a debugging echo service) may also send the secret back
//! disguised, so each known secret is also looked for as:
//! - upper case, lower case, and reversed;
//! - hex (lower and upper case);
//! - percent-encoded: every byte (`%73%6B...`, either case) and as a URL component or form
//!   value (only the reserved characters encoded);
//! - JSON `\u` escapes (either case) and HTML decimal entities (`&#115;`), as they appear in a
//!   body stored as text;
//! - base64, standard and URL-safe alphabet, padded or not, at any alignment inside a longer
//!   encoded text (so `Basic base64(key:)` and a base64 blob of a JSON document holding the key
//!   are both caught);
//! - for a secret of at least [`PIECE_MIN_SECRET`] characters, any piece of it at least
//!   [`PIECE`] characters long: a key split across two JSON fields, or cut short. Shorter
//!   pieces are left: a key's account part is shared with the account's other identifiers.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use serde_json::Value;
use std::collections::HashSet;
use std::fmt::Write as _;

/// What a secret is replaced with.
pub const MARK: &str = "[redacted]";

/// Secrets shorter than this are replaced only where they are a whole string: replacing
/// every occurrence of a short secret would mangle words, and would tell whoever can read
/// the text where the secret occurred.
const MIN_SUBSTRING: usize = 8;

/// The shortest piece of a secret that is replaced wherever it stands...
pub const PIECE: usize = 20;
/// ...in a secret at least this long (pieces of a shorter one are too close to all of it
/// to tell apart from what the exact and encoded forms already catch).
pub const PIECE_MIN_SECRET: usize = 32;

/// Prefixes of credentials whatever their tenant (Stripe secret, restricted and webhook
/// keys; reckon's API tokens).
const SHAPES: &[&str] = &[
    "sk_live_", "sk_test_", "rk_live_", "rk_test_", "whsec_", "rkn_",
];

/// Schemes of an `Authorization` value whose credential follows.
const SCHEMES: &[&str] = &["Bearer ", "bearer ", "Basic ", "basic "];

/// `Debug` shows how many secrets and forms it holds, never them.
#[derive(Clone, Default)]
pub struct Redactor {
    /// Secrets shorter than [`MIN_SUBSTRING`]: replaced only as a whole string.
    whole: Vec<String>,
    /// The secrets and their encoded forms, each replaced wherever it stands.
    needles: Vec<String>,
    /// Every [`PIECE`]-character piece of the long secrets.
    pieces: HashSet<String>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("forms", &(self.whole.len() + self.needles.len()))
            .field("pieces", &self.pieces.len())
            .finish()
    }
}

/// The forms of `secret` (at least [`MIN_SUBSTRING`] long) looked for in text.
fn disguises(secret: &str) -> Vec<String> {
    let bytes = secret.as_bytes();
    let mut out = vec![
        secret.to_owned(),
        secret.to_uppercase(),
        secret.to_lowercase(),
        secret.chars().rev().collect(),
        hex::encode(bytes),
        hex::encode_upper(bytes),
    ];
    let mut pct_upper = String::new();
    let mut json_lower = String::new();
    let mut html = String::new();
    for b in bytes {
        let _ = write!(pct_upper, "%{b:02X}");
        let _ = write!(html, "&#{b};");
    }
    for c in secret.chars() {
        let mut units = [0u16; 2];
        for u in c.encode_utf16(&mut units) {
            let _ = write!(json_lower, "\\u{u:04x}");
        }
    }
    out.push(pct_upper.to_lowercase());
    out.push(pct_upper);
    out.push(
        json_lower
            .replace("\\u", "\\U")
            .to_uppercase()
            .replace("\\U", "\\u"),
    );
    out.push(json_lower);
    out.push(html);
    let component: String = url::form_urlencoded::byte_serialize(bytes).collect();
    out.push(component.replace('+', "%20"));
    out.push(component);
    // Base64 at each of the three alignments a secret can have inside a longer encoded
    // text: the characters that encode only the secret's own bits (the first and last may
    // share bits with what surrounds it, and are left out).
    for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
        for offset in 0..3usize {
            let mut padded = vec![0u8; offset];
            padded.extend_from_slice(bytes);
            let encoded = engine.encode(&padded);
            let start = (offset * 8).div_ceil(6);
            let end = padded.len() * 8 / 6;
            if let Some(part) = encoded.get(start..end) {
                out.push(part.to_owned());
            }
        }
    }
    out.retain(|n| n.len() >= MIN_SUBSTRING);
    out
}

/// `text` with JSON `\uXXXX` escapes and HTML `&#NN;` / `&#xNN;` entities of printable
/// ASCII written as the characters they stand for. A disguised key cut short (an error
/// excerpt keeps 200 characters, a sixth of that of a key written in escapes) matches no
/// whole disguise; unescaped, its 20-character pieces do.
#[expect(
    clippy::string_slice,
    reason = "each cut is after an ASCII escape that parsed, or a whole character"
)]
fn printable_unescaped(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("\\u") && !text.contains("&#") {
        return std::borrow::Cow::Borrowed(text);
    }
    let printable = |n: u32| {
        (0x20..0x7f)
            .contains(&n)
            .then(|| char::from_u32(n))
            .flatten()
    };
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        let decoded = if let Some(hex) = rest.strip_prefix("\\u").and_then(|r| r.get(..4)) {
            u32::from_str_radix(hex, 16)
                .ok()
                .and_then(printable)
                .map(|ch| (ch, 6))
        } else if let Some(entity) = rest.strip_prefix("&#") {
            let (digits, radix, skip) = match entity.strip_prefix(['x', 'X']) {
                Some(h) => (h, 16, 3),
                None => (entity, 10, 2),
            };
            let len = digits.find(';').filter(|&n| (1..=6).contains(&n));
            len.and_then(|n| {
                u32::from_str_radix(&digits[..n], radix)
                    .ok()
                    .and_then(printable)
                    .map(|ch| (ch, skip + n + 1))
            })
        } else {
            None
        };
        match decoded {
            Some((ch, consumed)) => {
                out.push(ch);
                rest = &rest[consumed..];
            }
            None => {
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    std::borrow::Cow::Owned(out)
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
        let mut r = Redactor::default();
        for secret in out {
            if secret.len() < MIN_SUBSTRING {
                r.whole.push(secret);
                continue;
            }
            let chars: Vec<char> = secret.chars().collect();
            if chars.len() >= PIECE_MIN_SECRET {
                for w in chars.windows(PIECE) {
                    r.pieces.insert(w.iter().collect());
                }
            }
            r.needles.extend(disguises(&secret));
        }
        r.needles.sort();
        r.needles.dedup();
        r
    }

    /// `text` with every known secret (in any of its disguises) and credential shape
    /// replaced by [`MARK`].
    pub fn text(&self, text: &str) -> String {
        if self.whole.iter().any(|w| w == text) {
            return MARK.to_owned();
        }
        let mut s = self.replace_known(&printable_unescaped(text));
        for prefix in SHAPES {
            s = replace_tokens(&s, prefix, false);
        }
        for scheme in SCHEMES {
            s = replace_tokens(&s, scheme, true);
        }
        s
    }

    /// Every byte range of `text` that holds a needle or a piece, merged, replaced once.
    #[expect(
        clippy::string_slice,
        reason = "every range starts and ends where a match of a whole str began or ended"
    )]
    fn replace_known(&self, text: &str) -> String {
        let mut hits: Vec<(usize, usize)> = Vec::new();
        for needle in &self.needles {
            hits.extend(
                text.match_indices(needle.as_str())
                    .map(|(i, m)| (i, i + m.len())),
            );
        }
        if !self.pieces.is_empty() {
            let starts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
            for (n, &from) in starts.iter().enumerate() {
                let to = starts.get(n + PIECE).copied().unwrap_or(text.len());
                if n + PIECE <= starts.len() && self.pieces.contains(&text[from..to]) {
                    hits.push((from, to));
                }
            }
        }
        if hits.is_empty() {
            return text.to_owned();
        }
        hits.sort_unstable();
        let mut out = String::with_capacity(text.len());
        let mut done = 0;
        let mut current: Option<(usize, usize)> = None;
        for (from, to) in hits {
            match current {
                Some((a, b)) if from <= b => current = Some((a, b.max(to))),
                _ => {
                    if let Some((a, b)) = current {
                        out.push_str(&text[done..a]);
                        out.push_str(MARK);
                        done = b;
                    }
                    current = Some((from, to));
                }
            }
        }
        if let Some((a, b)) = current {
            out.push_str(&text[done..a]);
            out.push_str(MARK);
            done = b;
        }
        out.push_str(&text[done..]);
        out
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

/// The longest piece of a provider's error field kept.
pub const EXCERPT_FIELD_CHARS: usize = 200;

/// What of a provider's error answer is kept: its `type`, `code` and `message` (of an
/// `error` object, or of the top level; a string `error` counts as the message), each cut to
/// [`EXCERPT_FIELD_CHARS`] characters, and nothing else: the rest of a body (and a body
/// that is not JSON) explains nothing a person needs and may carry whatever the provider
/// echoed. The caller still redacts the excerpt with the request's secrets.
pub fn error_excerpt(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return String::new();
    };
    let error = match v.get("error") {
        Some(e @ Value::Object(_)) => e,
        _ => &v,
    };
    let field = |name: &str| -> Option<String> {
        let text = match (name, error.get(name), v.get("error")) {
            (_, Some(Value::String(s)), _) => s.clone(),
            (_, Some(n @ Value::Number(_)), _) => n.to_string(),
            ("message", None, Some(Value::String(s))) => s.clone(),
            _ => return None,
        };
        let text: String = text
            .chars()
            .filter(|c| !c.is_control())
            .take(EXCERPT_FIELD_CHARS)
            .collect();
        (!text.trim().is_empty()).then_some(text)
    };
    let kind = [field("type"), field("code")]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("/");
    match (kind.is_empty(), field("message")) {
        (true, None) => String::new(),
        (true, Some(m)) => m,
        (false, None) => format!("[{kind}]"),
        (false, Some(m)) => format!("[{kind}] {m}"),
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

    /// A key written in JSON escapes (or HTML entities) inside an error message, cut short
    /// by the excerpt's cap: no whole disguise is left to match, and the escaped fragment
    /// is still caught by its pieces; escapes of other text are left readable.
    #[test]
    fn an_escaped_key_cut_short_by_the_excerpt_is_still_caught() {
        let key = "rk_live_51HxYzAbCdEfGhIjKlMnOpQrStUvWxYz0123456789";
        let r = Redactor::new([key]);
        let escaped: String = key
            .chars()
            .map(|c| format!("\\u{:04x}", u32::from(c)))
            .collect();
        let body = serde_json::to_vec(&json!({"error": {
            "type": "invalid_request_error",
            "message": format!("Invalid API Key provided: {escaped}")
        }}))
        .unwrap();
        let excerpt = error_excerpt(&body);
        assert!(excerpt.len() < escaped.len(), "the cap cut it: {excerpt}");
        let out = r.text(&excerpt);
        assert!(out.contains(MARK), "{out}");
        let tail: String = key.chars().take(25).skip(5).collect();
        assert!(!out.contains(&tail), "{out}");
        let entities: String = key
            .chars()
            .take(30)
            .map(|c| format!("&#{};", u32::from(c)))
            .collect();
        assert!(r.text(&format!("echo {entities}")).contains(MARK));
        assert_eq!(r.text("caf\\u0065 &#x41;"), "cafe A");
    }

    /// The key a provider echoed in the disguises seen in the wild: none survives, and the
    /// text around it does.
    #[test]
    fn an_echoed_key_is_replaced_in_its_common_encodings() {
        use base64::engine::general_purpose::{STANDARD, URL_SAFE};
        let key = "sk_live_51HxYzAbCdEfGhIjKlMnOpQrStUvWxYz0123456789?+/~";
        let r = Redactor::new([key]);
        let b = key.as_bytes();
        let pct_all: String = b.iter().map(|x| format!("%{x:02X}")).collect();
        let json_u: String = key
            .chars()
            .map(|c| format!("\\u{:04x}", u32::from(c)))
            .collect();
        let html: String = b.iter().map(|x| format!("&#{x};")).collect();
        let component: String = url::form_urlencoded::byte_serialize(b).collect();
        let mut blob = b"{\"note\":\"".to_vec();
        blob.extend_from_slice(b);
        blob.extend_from_slice(b"\"}");
        let disguised = [
            ("std base64", STANDARD.encode(b)),
            ("std base64 unpadded", STANDARD_NO_PAD.encode(b)),
            ("url-safe base64", URL_SAFE.encode(b)),
            ("url-safe base64 unpadded", URL_SAFE_NO_PAD.encode(b)),
            ("basic credentials", STANDARD.encode(format!("{key}:"))),
            ("base64 of a document holding it", STANDARD.encode(&blob)),
            ("base64 shifted by one", STANDARD.encode(format!("x{key}"))),
            ("percent, every byte", pct_all.clone()),
            ("percent, lower case", pct_all.to_lowercase()),
            ("URL component", component),
            ("hex", hex::encode(b)),
            ("HEX", hex::encode_upper(b)),
            ("JSON escapes", json_u.clone()),
            (
                "JSON escapes, upper case",
                json_u.to_uppercase().replace("\\U", "\\u"),
            ),
            ("HTML entities", html),
            ("reversed", key.chars().rev().collect()),
            ("upper case", key.to_uppercase()),
            ("cut short", key.get(..40).unwrap().to_owned()),
        ];
        for (what, form) in disguised {
            let out = r.text(&format!("echo <{form}> end"));
            assert!(
                out.starts_with("echo <") && out.ends_with("> end"),
                "{what}: {out}"
            );
            assert!(out.contains(MARK), "{what}: {out}");
            // A base64 form keeps at most two characters that share bits with its
            // neighbours, and its padding (the document's own text around the key stays).
            let left = out.replace(MARK, "");
            let around = if what.contains("document") { 24 } else { 6 };
            assert!(left.len() <= "echo <> end".len() + around, "{what}: {out}");
        }
    }

    #[test]
    fn a_key_split_across_json_fields_is_replaced_in_each() {
        let key = "rk_live_51HxYzAbCdEfGhIjKlMnOpQrStUvWxYz0123456789";
        let r = Redactor::new([key]);
        let (a, b) = key.split_at(24);
        let mut v = json!({"error": {"part1": a, "part2": b, "code": "api_key_invalid"}});
        r.json(&mut v);
        assert_eq!(
            v,
            json!({"error": {"part1": MARK, "part2": MARK, "code": "api_key_invalid"}})
        );
        // Words and identifiers that merely share a few characters stay.
        assert_eq!(
            r.text("account acct_1HxYzAbCdEfGh"),
            "account acct_1HxYzAbCdEfGh"
        );
    }

    #[test]
    fn an_error_answer_keeps_its_type_code_and_a_bounded_message_only() {
        let body = json!({"error": {"type": "invalid_request_error", "code": "api_key_expired",
            "message": "Expired API Key provided", "doc_url": "https://x", "request_log_url": "https://y",
            "echo": {"headers": {"authorization": "Bearer sk_live_abc"}}}});
        assert_eq!(
            error_excerpt(body.to_string().as_bytes()),
            "[invalid_request_error/api_key_expired] Expired API Key provided"
        );
        let long = json!({"error": {"message": "x".repeat(100_000)}});
        assert_eq!(
            error_excerpt(long.to_string().as_bytes()).len(),
            EXCERPT_FIELD_CHARS
        );
        assert_eq!(
            error_excerpt(br#"{"error": "nope", "code": 7}"#),
            "[7] nope"
        );
        assert_eq!(error_excerpt(b"<html>sk_live_abc echoed</html>"), "");
        assert_eq!(error_excerpt(br#"{"data": {"key": "sk_live_abc"}}"#), "");
    }
}
