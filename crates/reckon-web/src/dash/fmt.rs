//! How the dashboard writes times, ages and keys. Templates get finished strings (askama
//! escapes them); nothing here builds HTML.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// A moment, shown as "30 Nov 14:02 UTC" with the full RFC 3339 form for `<time datetime>`
/// and the hover title.
#[derive(Debug, Clone)]
pub struct When {
    pub text: String,
    pub iso: String,
}

pub fn when(t: f64) -> When {
    match jiff::Timestamp::from_second(t.floor() as i64) {
        Ok(ts) => When {
            text: ts.strftime("%d %b %Y %H:%M UTC").to_string(),
            iso: ts.to_string(),
        },
        Err(_) => When {
            text: format!("{t}"),
            iso: String::new(),
        },
    }
}

pub fn when_opt(t: Option<f64>) -> Option<When> {
    t.map(when)
}

/// A duration in words for people: "45 s", "12 min", "3 h 5 min", "2 d 4 h".
pub fn age(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86400 => match (s % 3600) / 60 {
            0 => format!("{} h", s / 3600),
            m => format!("{} h {m} min", s / 3600),
        },
        _ => match (s % 86400) / 3600 {
            0 => format!("{} d", s / 86400),
            h => format!("{} d {h} h", s / 86400),
        },
    }
}

/// Everything but unreserved characters is escaped: keys hold `:`, `/`, `?`, `#`, spaces
/// and anything else a tenant put in them.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

pub fn seg(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

/// The dashboard URL of one effect (the same source/key addressing as the API).
pub fn effect_href(tenant: &str, source: &str, key: &str) -> String {
    format!("/t/{}/effects/{}/{}", seg(tenant), seg(source), seg(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_people_write_them() {
        assert_eq!(age(5.0), "5 s");
        assert_eq!(age(125.0), "2 min");
        assert_eq!(age(3600.0), "1 h");
        assert_eq!(age(3.0 * 3600.0 + 300.0), "3 h 5 min");
        assert_eq!(age(2.0 * 86400.0 + 4.0 * 3600.0), "2 d 4 h");
        assert_eq!(age(-3.0), "0 s");
    }

    #[test]
    fn times_are_utc_with_an_iso_form() {
        let w = when(1_764_511_320.5);
        assert_eq!(w.text, "30 Nov 2025 14:02 UTC");
        assert_eq!(w.iso, "2025-11-30T14:02:00Z");
    }

    #[test]
    fn keys_are_escaped_whole_in_urls() {
        assert_eq!(
            effect_href("acme", "shop", "charge:v1:<x>/../?#"),
            "/t/acme/effects/shop/charge%3Av1%3A%3Cx%3E%2F..%2F%3F%23"
        );
    }
}
