//! How the dashboard writes times, ages and keys. Templates get finished strings (askama
//! escapes them); nothing here builds HTML.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use jiff::tz::TimeZone;

/// A moment, shown in the tenant's time zone ("28 Nov 2026 14:02 CET"), with the RFC 3339
/// form for `<time datetime>` and the same moment in UTC for the hover title.
#[derive(Debug, Clone)]
pub struct When {
    pub text: String,
    pub iso: String,
    pub utc: String,
}

/// `t` in UTC (pages that know no tenant zone, and tenants whose zone is UTC).
pub fn when(t: f64) -> When {
    when_in(t, &TimeZone::UTC)
}

/// `t` in `tz` (the one format of [`reckon_engine::when`], which the CLI writes too); the
/// hover title keeps UTC.
pub fn when_in(t: f64, tz: &TimeZone) -> When {
    match jiff::Timestamp::from_second(t.floor() as i64) {
        Ok(ts) => When {
            text: reckon_engine::when::text(t, tz),
            iso: ts.to_string(),
            utc: reckon_engine::when::utc(t),
        },
        Err(_) => When {
            text: format!("{t}"),
            iso: String::new(),
            utc: String::new(),
        },
    }
}

pub fn when_opt(t: Option<f64>) -> Option<When> {
    t.map(when)
}

pub fn when_opt_in(t: Option<f64>, tz: &TimeZone) -> Option<When> {
    t.map(|t| when_in(t, tz))
}

/// The tenant's zone by name (its audit settings); an unknown name (which the settings
/// refuse to store) falls back to UTC rather than failing a page.
pub use reckon_engine::when::zone;

/// A run's day (`2026-11-28`) as the pages write dates: "28 Nov 2026".
pub use reckon_engine::when::day_text;

/// An amount in minor units as people read it (`$1,234.00`): the lookup's own wording, so
/// every page and the CLI write money alike.
pub use reckon_engine::answer::money;

/// A duration in words for people: "45 s", "12 min", "3 h 5 min", "2 d 4 h".
pub use reckon_engine::answer::age;

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

/// "a provider named …" -> "A provider named ….": the command's words as the page says them.
pub fn sentence(s: &str) -> String {
    let mut c = s.chars();
    let mut out: String = c
        .next()
        .map(|f| f.to_uppercase().collect())
        .unwrap_or_default();
    out.push_str(c.as_str());
    if !out.ends_with('.') {
        out.push('.');
    }
    out
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
        assert_eq!(w.utc, "30 Nov 2025 14:02 UTC");
    }

    #[test]
    fn times_read_in_the_tenants_zone_with_utc_kept_for_the_hover() {
        let w = when_in(1_764_511_320.0, &zone("Europe/Paris"));
        assert_eq!(w.text, "30 Nov 2025 15:02 CET");
        assert_eq!(w.utc, "30 Nov 2025 14:02 UTC");
        assert_eq!(w.iso, "2025-11-30T14:02:00Z");
        assert_eq!(zone("Not/AZone"), TimeZone::UTC);
    }

    #[test]
    fn amounts_are_rendered_per_currency_from_minor_units() {
        assert_eq!(money(2000, "usd"), "$20.00");
        assert_eq!(money(1999, "EUR"), "€19.99");
        assert_eq!(money(-550, "gbp"), "-£5.50");
        assert_eq!(money(500, "jpy"), "¥500");
        assert_eq!(money(1234, "chf"), "12.34 CHF");
        assert_eq!(money(7, "krw"), "7 KRW");
    }

    #[test]
    fn keys_are_escaped_whole_in_urls() {
        assert_eq!(
            effect_href("acme", "shop", "charge:v1:<x>/../?#"),
            "/t/acme/effects/shop/charge%3Av1%3A%3Cx%3E%2F..%2F%3F%23"
        );
    }
}
