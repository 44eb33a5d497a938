//! Stores by column mapping: idempotency tables that are not justonce's, read as if they
//! were. A mapping says which table, how a row's key is built from its columns, which
//! condition over its columns means each of the four states, where the lease ends, which
//! columns hold its times, request and response. None of these states has to be a column:
//! in Brandur Leach's `idempotency_keys` an "unknown" outcome is `recovery_point =
//! 'finished'` with `response_code = 503`.
//!
//! The key is the effect's key in reckon, and the one reckon asks the provider about
//! (through the provider's `key_template`). A store that sends the provider a key derived
//! from its row rather than its client's key is mapped with that derivation as its key:
//! Brandur's sends Stripe `rocket-rides-atomic-{id}`, and asking Stripe about the client's
//! key would find nothing where a charge exists.
//!
//! A mapping is data, never SQL: conditions are parsed by [`cond`] into a typed tree and
//! rendered with quoted identifiers and bound parameters (`render.rs`); templates only name
//! columns. The reader built from it keeps the justonce reader's guarantees (a read-only
//! transaction, `(updated_at, key)` order, every row handed over undecoded for
//! `reckon_domain::validate_row`, so a row no condition matches is quarantined, not
//! guessed). [`check`](crate::SourceConn::check_mapping) holds a mapping against the live
//! table before a source is saved.

mod check;
pub mod cond;
pub(crate) mod render;

use cond::{Cond, ParseError};
use serde::Deserialize;
use std::fmt;

/// Why a mapping is refused: one sentence naming the field and, where there is one, the
/// column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MappingError {
    #[error("the mapping is not valid JSON settings: {0}")]
    Settings(String),
    #[error("the mapping names the preset {0:?}, which is not one of justonce, brandur")]
    UnknownPreset(String),
    #[error("the mapping has no {0} (give it, or start from a preset)")]
    Missing(&'static str),
    #[error("the mapping's {field} is not valid: {why}")]
    Invalid { field: String, why: String },
    #[error("the {state} condition does not parse: {}", .error.0)]
    Condition {
        state: &'static str,
        error: ParseError,
    },
    #[error(
        "the mapping's {field} names the column \"{column}\", which the table {table} does \
         not have (its columns: {columns})"
    )]
    NoSuchColumn {
        field: String,
        column: String,
        table: String,
        columns: String,
    },
    #[error("the table {0} does not exist, or the source's user cannot see it")]
    NoSuchTable(String),
    #[error("{0}")]
    Column(String),
    #[error("the {state} condition does not run against the table {table}: {message}")]
    Runs {
        state: &'static str,
        table: String,
        message: String,
    },
    #[error("{0}")]
    Overlap(String),
    #[error("cannot check the mapping against the table: {0}")]
    Query(String),
}

/// The four states, in the order their conditions are tried: a row two conditions match
/// takes the more cautious state (a mapping that overlaps is refused at save, but the
/// table may change after).
pub const STATES: [&str; 4] = ["unknown", "in_progress", "failed", "succeeded"];

/// The state text of a row no condition matches: `validate_row` quarantines it as an
/// unknown state, naming this.
pub const UNMATCHED: &str = "no mapped condition matched";

/// A key built from a row: literal text and column values, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Template(pub Vec<Piece>);

#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Column(String),
}

impl Template {
    /// `{column}` stands for a column's value, `{{` and `}}` for a brace.
    pub fn parse(src: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut chars = src.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    text.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    text.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => name.push(c),
                            None => return Err(format!("{{{name} is not closed by '}}'")),
                        }
                    }
                    cond::column_name(&name).map_err(|e| e.0)?;
                    if !text.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut text)));
                    }
                    pieces.push(Piece::Column(name));
                }
                '}' => return Err("a '}' without its '{' (write '}}' for a brace)".into()),
                '\0' => return Err("it contains a NUL character".into()),
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        if !pieces.iter().any(|p| matches!(p, Piece::Column(_))) {
            return Err("it names no column (write {column})".into());
        }
        Ok(Template(pieces))
    }

    pub fn columns(&self) -> Vec<&str> {
        self.0
            .iter()
            .filter_map(|p| match p {
                Piece::Column(c) => Some(c.as_str()),
                Piece::Text(_) => None,
            })
            .collect()
    }

    /// The one column this template is, when it is nothing else.
    pub fn single_column(&self) -> Option<&str> {
        match self.0.as_slice() {
            [Piece::Column(c)] => Some(c),
            _ => None,
        }
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.0 {
            match p {
                Piece::Text(t) => f.write_str(&t.replace('{', "{{").replace('}', "}}"))?,
                Piece::Column(c) => write!(f, "{{{c}}}")?,
            }
        }
        Ok(())
    }
}

/// How a column holds a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeUnit {
    /// Seconds since the Unix epoch, as a number (justonce's `time.time()`).
    Epoch,
    /// A SQL timestamp or date (`TIMESTAMPTZ`, `DATETIME`, SQLite's ISO-8601 text). A
    /// zoneless one is read as UTC.
    Timestamp,
}

/// A moment of the row: the first non-NULL of its columns, plus a fixed number of seconds
/// (a lease that the application keeps as "locked at" rather than "expires at").
#[derive(Debug, Clone, PartialEq)]
pub struct TimeSpec {
    pub columns: Vec<String>,
    pub unit: TimeUnit,
    pub plus_secs: f64,
}

/// Where the row's state comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum StateSpec {
    /// A column holding justonce's four words.
    Column(String),
    /// One condition per state, tried in the order of [`STATES`].
    Conditions(Vec<(&'static str, Cond)>),
}

/// The request column: kept as the request hash, or fingerprinted (SHA-256) when it holds
/// the request itself (Brandur's `request_params`).
#[derive(Debug, Clone, PartialEq)]
pub enum RequestSpec {
    Hash(String),
    Fingerprint(String),
}

/// A validated mapping (its shape only; [`crate::SourceConn::check_mapping`] holds it
/// against the live table).
#[derive(Debug, Clone, PartialEq)]
pub struct Mapping {
    pub table: String,
    pub key: Template,
    pub state: StateSpec,
    pub created_at: TimeSpec,
    pub updated_at: TimeSpec,
    pub lease_expires: Option<TimeSpec>,
    pub attempts: Option<String>,
    pub request: Option<RequestSpec>,
    pub response: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    preset: Option<String>,
    table: Option<String>,
    key: Option<String>,
    state: Option<StateSettings>,
    created_at: Option<TimeSettings>,
    updated_at: Option<TimeSettings>,
    lease_expires: Option<TimeSettings>,
    attempts: Option<String>,
    request_hash: Option<String>,
    request: Option<String>,
    response: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum StateSettings {
    Column(String),
    Conditions(Conditions),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Conditions {
    succeeded: String,
    failed: String,
    unknown: String,
    in_progress: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TimeSettings {
    column: OneOrMore,
    unit: TimeUnit,
    #[serde(default)]
    plus_secs: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum OneOrMore {
    One(String),
    More(Vec<String>),
}

/// The shipped presets, as the settings a person could have written.
pub const PRESETS: [(&str, &str); 2] = [("justonce", JUSTONCE), ("brandur", BRANDUR)];

/// justonce's own `justonce_keys` (reference: justonce-store.md): the reader reckon has
/// always had, as a mapping.
const JUSTONCE: &str = r#"{
    "table": "justonce_keys",
    "key": "{key}",
    "state": "state",
    "created_at": {"column": "created_at", "unit": "epoch"},
    "updated_at": {"column": "updated_at", "unit": "epoch"},
    "lease_expires": {"column": "expires_at", "unit": "epoch"},
    "attempts": "attempts",
    "request_hash": "request_hash",
    "response": "response"
}"#;

/// Brandur Leach's `idempotency_keys` (brandur/rocket-rides-atomic, `schema.sql` and
/// `api.rb`). A request moves `started` -> `ride_created` -> `charge_created` ->
/// `finished`; `finished` stores the HTTP answer in `response_code`. The charge is
/// created at `ride_created` with the idempotency key `rocket-rides-atomic-{id}` (the
/// row's id, not the client's key: the effect's key here); a card error finishes with 402
/// (no charge), any other Stripe error, a connection error or timeout among them,
/// finishes with 503 although the charge may exist: that is unknown, not failed.
/// `locked_at` is cleared on finish and on error; a lock is held 90 s, from `locked_at`,
/// or from the last run once an error released it.
const BRANDUR: &str = r#"{
    "table": "idempotency_keys",
    "key": "rocket-rides-atomic-{id}",
    "state": {
        "succeeded": "recovery_point = 'finished' AND response_code >= 200 AND response_code < 300",
        "failed": "recovery_point = 'finished' AND response_code >= 400 AND response_code < 500",
        "unknown": "recovery_point = 'finished' AND (response_code IS NULL OR response_code < 200 OR (response_code >= 300 AND response_code < 400) OR response_code >= 500)",
        "in_progress": "recovery_point IN ('started', 'ride_created', 'charge_created')"
    },
    "created_at": {"column": "created_at", "unit": "timestamp"},
    "updated_at": {"column": "last_run_at", "unit": "timestamp"},
    "lease_expires": {"column": ["locked_at", "last_run_at"], "unit": "timestamp", "plus_secs": 90},
    "request": "request_params",
    "response": "response_body"
}"#;

fn preset(name: &str) -> Result<Settings, MappingError> {
    let (_, json) = PRESETS
        .iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| MappingError::UnknownPreset(name.to_owned()))?;
    Ok(serde_json::from_str(json).expect("the shipped presets parse"))
}

fn invalid(field: &str, why: impl Into<String>) -> MappingError {
    MappingError::Invalid {
        field: field.to_owned(),
        why: why.into(),
    }
}

fn column(field: &str, c: String) -> Result<String, MappingError> {
    cond::column_name(&c).map_err(|e| invalid(field, e.0))?;
    Ok(c)
}

fn time(field: &'static str, t: Option<TimeSettings>) -> Result<Option<TimeSpec>, MappingError> {
    let Some(t) = t else { return Ok(None) };
    let columns = match t.column {
        OneOrMore::One(c) => vec![c],
        OneOrMore::More(v) => v,
    };
    if columns.is_empty() || columns.len() > 4 {
        return Err(invalid(field, "column names one to four columns"));
    }
    let columns = columns
        .into_iter()
        .map(|c| column(field, c))
        .collect::<Result<Vec<_>, _>>()?;
    if !t.plus_secs.is_finite() || !(0.0..=31_536_000.0).contains(&t.plus_secs) {
        return Err(invalid(field, "plus_secs is between 0 and a year"));
    }
    Ok(Some(TimeSpec {
        columns,
        unit: t.unit,
        plus_secs: t.plus_secs,
    }))
}

impl Mapping {
    /// A mapping from a source's settings: a preset's name alone (`"brandur"`), or a JSON
    /// object, optionally starting from a `"preset"` whose fields it replaces.
    pub fn parse(settings: &str) -> Result<Mapping, MappingError> {
        let trimmed = settings.trim();
        let given: Settings = if trimmed.starts_with('{') {
            serde_json::from_str(trimmed).map_err(|e| MappingError::Settings(e.to_string()))?
        } else {
            Settings {
                preset: Some(trimmed.to_owned()),
                ..Settings::default()
            }
        };
        let s = match &given.preset {
            None => given,
            Some(name) => {
                let base = preset(name)?;
                Settings {
                    preset: None,
                    table: given.table.or(base.table),
                    key: given.key.or(base.key),
                    state: given.state.or(base.state),
                    created_at: given.created_at.or(base.created_at),
                    updated_at: given.updated_at.or(base.updated_at),
                    lease_expires: given.lease_expires.or(base.lease_expires),
                    attempts: given.attempts.or(base.attempts),
                    request_hash: given.request_hash.or(base.request_hash),
                    request: given.request.or(base.request),
                    response: given.response.or(base.response),
                }
            }
        };
        Mapping::from_settings(s)
    }

    fn from_settings(s: Settings) -> Result<Mapping, MappingError> {
        let table = s.table.ok_or(MappingError::Missing("table"))?;
        let parts: Vec<&str> = table.split('.').collect();
        if parts.len() > 2 || parts.iter().any(|p| cond::column_name(p).is_err()) {
            return Err(invalid(
                "table",
                "a table is a name (letters, digits and '_', up to 63), optionally                  schema.table",
            ));
        }
        let key = Template::parse(&s.key.ok_or(MappingError::Missing("key"))?)
            .map_err(|e| invalid("key", e))?;
        let state = match s.state.ok_or(MappingError::Missing("state"))? {
            StateSettings::Column(c) => StateSpec::Column(column("state", c)?),
            StateSettings::Conditions(c) => {
                let parse = |state: &'static str, src: &str| {
                    cond::parse(src)
                        .map(|c| (state, c))
                        .map_err(|error| MappingError::Condition { state, error })
                };
                StateSpec::Conditions(vec![
                    parse("unknown", &c.unknown)?,
                    parse("in_progress", &c.in_progress)?,
                    parse("failed", &c.failed)?,
                    parse("succeeded", &c.succeeded)?,
                ])
            }
        };
        let created_at =
            time("created_at", s.created_at)?.ok_or(MappingError::Missing("created_at"))?;
        let updated_at =
            time("updated_at", s.updated_at)?.ok_or(MappingError::Missing("updated_at"))?;
        let lease_expires = time("lease_expires", s.lease_expires)?;
        let request = match (s.request_hash, s.request) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "request",
                    "give request_hash (a column holding a hash) or request (a column \
                     holding the request, fingerprinted), not both",
                ));
            }
            (Some(c), None) => Some(RequestSpec::Hash(column("request_hash", c)?)),
            (None, Some(c)) => Some(RequestSpec::Fingerprint(column("request", c)?)),
            (None, None) => None,
        };
        Ok(Mapping {
            table,
            key,
            state,
            created_at,
            updated_at,
            lease_expires,
            attempts: s.attempts.map(|c| column("attempts", c)).transpose()?,
            request,
            response: s.response.map(|c| column("response", c)).transpose()?,
        })
    }

    /// The preset of this name.
    pub fn preset(name: &str) -> Result<Mapping, MappingError> {
        Mapping::from_settings(preset(name)?)
    }

    /// Every column the mapping reads, with the field that names it, in the order of the
    /// fields.
    pub fn columns(&self) -> Vec<(String, &str)> {
        let mut out: Vec<(String, &str)> = Vec::new();
        for c in self.key.columns() {
            out.push(("key".into(), c));
        }
        match &self.state {
            StateSpec::Column(c) => out.push(("state".into(), c)),
            StateSpec::Conditions(conds) => {
                for (state, cond) in conds {
                    for c in cond.columns() {
                        out.push((format!("{state} condition"), c));
                    }
                }
            }
        }
        for (field, t) in [
            ("created_at", Some(&self.created_at)),
            ("updated_at", Some(&self.updated_at)),
            ("lease_expires", self.lease_expires.as_ref()),
        ] {
            for c in t.into_iter().flat_map(|t| &t.columns) {
                out.push((field.into(), c));
            }
        }
        if let Some(c) = &self.attempts {
            out.push(("attempts".into(), c));
        }
        match &self.request {
            Some(RequestSpec::Hash(c)) => out.push(("request_hash".into(), c)),
            Some(RequestSpec::Fingerprint(c)) => out.push(("request".into(), c)),
            None => {}
        }
        if let Some(c) = &self.response {
            out.push(("response".into(), c));
        }
        out
    }
}

/// What holding a mapping against its live table found: how many rows each state's
/// condition matches, and how many no condition matches (they would be quarantined).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MappingCheck {
    pub table: String,
    pub rows: i64,
    /// `(state, rows)` in the order of [`STATES`].
    pub states: Vec<(String, i64)>,
    pub unmatched: i64,
}

impl fmt::Display for MappingCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} rows", self.table, self.rows)?;
        for (state, n) in &self.states {
            write!(f, ", {state} {n}")?;
        }
        write!(f, ", matched by no condition {}", self.unmatched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_presets_parse_and_brandurs_503_is_tried_as_unknown_before_anything_else() {
        let j = Mapping::preset("justonce").unwrap();
        assert_eq!(j.state, StateSpec::Column("state".into()));
        assert_eq!(j.key.single_column(), Some("key"));
        let b = Mapping::parse("brandur").unwrap();
        assert_eq!(b.table, "idempotency_keys");
        assert_eq!(b.key.to_string(), "rocket-rides-atomic-{id}");
        let StateSpec::Conditions(c) = &b.state else {
            panic!("brandur maps states by conditions")
        };
        assert_eq!(c[0].0, "unknown");
        assert_eq!(c[0].1.columns(), vec!["recovery_point", "response_code"]);
        let lease = b.lease_expires.as_ref().unwrap();
        assert_eq!(lease.columns, vec!["locked_at", "last_run_at"]);
        assert!((lease.plus_secs - 90.0).abs() < f64::EPSILON);
        assert_eq!(b.columns().first(), Some(&("key".to_string(), "id")));
    }

    #[test]
    fn a_preset_can_be_started_from_and_its_fields_replaced() {
        let m = Mapping::parse(r#"{"preset": "brandur", "table": "billing.idem_keys"}"#).unwrap();
        assert_eq!(m.table, "billing.idem_keys");
        assert_eq!(m.key, Mapping::preset("brandur").unwrap().key);
    }

    #[test]
    fn a_wrong_mapping_is_refused_with_a_sentence_naming_the_field() {
        let said = |s: &str| Mapping::parse(s).unwrap_err().to_string();
        assert_eq!(
            said("stripe_like"),
            "the mapping names the preset \"stripe_like\", which is not one of justonce, brandur"
        );
        assert_eq!(
            said(r#"{"preset": "brandur", "key": "{user id}"}"#),
            "the mapping's key is not valid: \"user id\" is not a column name (letters, \
             digits and '_', up to 63, not starting with a digit)"
        );
        let e = said(
            r#"{"preset": "brandur", "state": {"succeeded": "response_code = 200; DELETE FROM x",
                "failed": "response_code = 402", "unknown": "response_code = 503",
                "in_progress": "response_code IS NULL"}}"#,
        );
        assert_eq!(
            e,
            "the succeeded condition does not parse: ';' is not part of a condition"
        );
        assert!(said(r#"{"preset": "brandur", "sql": "x"}"#).contains("unknown field `sql`"));
        assert_eq!(
            said(r#"{"key": "{k}"}"#),
            "the mapping has no table (give it, or start from a preset)"
        );
        assert!(said(r#"{"preset": "brandur", "key": "static"}"#).contains("names no column"));
        assert!(said(r#"{"preset": "brandur", "provider_key": "{id}"}"#).contains("unknown field"));
        assert!(said(r#"{"preset": "brandur", "table": "x; drop"}"#).contains("table"));
        assert!(
            said(r#"{"preset": "justonce", "request": "request_params"}"#).contains("not both")
        );
    }

    #[test]
    fn templates_read_back_as_written() {
        for t in ["{id}", "rocket-rides-atomic-{id}", "{a}:{b}", "x{{y}}-{c}"] {
            assert_eq!(Template::parse(t).unwrap().to_string(), t);
        }
        assert!(Template::parse("{a").is_err());
        assert!(Template::parse("a}").is_err());
        assert!(Template::parse("{}").is_err());
    }
}
