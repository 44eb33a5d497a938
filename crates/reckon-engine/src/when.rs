//! How reckon writes a moment for people, the one way every surface does: dashboard pages,
//! CLI tables and CSV, the lookup's sentences: "28 Nov 2026 14:02 CET", in the tenant's
//! time zone (its audit settings, UTC unless set), to the minute. Machines get epoch
//! seconds (JSON) or RFC 3339 (`<time datetime>`), never this text.

use jiff::tz::TimeZone;

/// The format of [`text`] (strftime): day, month's short name, year, time, zone.
pub const FORMAT: &str = "%d %b %Y %H:%M %Z";

/// The format of [`day_text`]: a calendar day as [`text`] writes its date.
pub const DAY_FORMAT: &str = "%d %b %Y";

/// The tenant's zone by name; an unknown name (which the settings refuse to store) is UTC
/// rather than a failure.
pub fn zone(name: &str) -> TimeZone {
    TimeZone::get(name).unwrap_or(TimeZone::UTC)
}

/// `t` (epoch seconds) in `tz`: "28 Nov 2026 14:02 CET". A time outside the calendar's
/// range (no real ledger time) is written as its number.
pub fn text(t: f64, tz: &TimeZone) -> String {
    match jiff::Timestamp::from_second(t.floor() as i64) {
        Ok(ts) => ts.to_zoned(tz.clone()).strftime(FORMAT).to_string(),
        Err(_) => t.to_string(),
    }
}

/// `t` in UTC, the same format ("28 Nov 2026 13:02 UTC"): the hover title beside a
/// tenant-zone time, and what a command with no tenant writes.
pub fn utc(t: f64) -> String {
    text(t, &TimeZone::UTC)
}

/// A calendar day named as audit runs name it (`2026-11-28`) written as [`text`] writes
/// dates: "28 Nov 2026". Anything else is returned as it is.
pub fn day_text(day: &str) -> String {
    match day.parse::<jiff::civil::Date>() {
        Ok(d) => d.strftime(DAY_FORMAT).to_string(),
        Err(_) => day.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_format_in_the_tenants_zone_or_utc() {
        // 30 Nov 2025 14:02:00.5 UTC
        let t = 1_764_511_320.5;
        assert_eq!(text(t, &zone("Europe/Paris")), "30 Nov 2025 15:02 CET");
        assert_eq!(utc(t), "30 Nov 2025 14:02 UTC");
        assert_eq!(text(t, &zone("Not/AZone")), "30 Nov 2025 14:02 UTC");
        assert_eq!(text(1e12, &TimeZone::UTC), "1000000000000");
        assert_eq!(day_text("2025-11-30"), "30 Nov 2025");
        assert_eq!(day_text("yesterday"), "yesterday");
    }
}
