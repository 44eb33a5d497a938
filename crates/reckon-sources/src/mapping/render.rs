//! A mapping rendered as SQL of one dialect: identifiers quoted by reckon (they were held
//! to `[A-Za-z_][A-Za-z0-9_]*` when parsed, so a quote cannot occur in one), every literal a
//! tenant wrote bound as a parameter. The select list has the aliases of the justonce
//! reader's (`scan.rs`), so its row decoding is the one used for both.

use super::cond::{Cond, Lit};
use super::{Mapping, Piece, RequestSpec, StateSpec, Template, TimeSpec, TimeUnit, UNMATCHED};
use crate::dsn::Dialect;

/// SQL text and its parameters, in the order they appear.
pub(crate) struct Sql {
    pub dialect: Dialect,
    pub text: String,
    pub params: Vec<Lit>,
}

impl Sql {
    pub fn new(dialect: Dialect) -> Sql {
        Sql {
            dialect,
            text: String::new(),
            params: Vec::new(),
        }
    }

    pub fn push(&mut self, s: &str) -> &mut Sql {
        self.text.push_str(s);
        self
    }

    pub fn param(&mut self, l: Lit) -> &mut Sql {
        self.params.push(l);
        let n = self.params.len();
        match self.dialect {
            Dialect::Postgres => self.text.push_str(&format!("${n}")),
            Dialect::Sqlite => self.text.push_str(&format!("?{n}")),
            Dialect::Mysql => self.text.push('?'),
        }
        self
    }

    pub fn ident(&mut self, c: &str) -> &mut Sql {
        debug_assert!(super::cond::column_name(c).is_ok());
        let q = if self.dialect == Dialect::Mysql {
            '`'
        } else {
            '"'
        };
        self.text.push(q);
        self.text.push_str(c);
        self.text.push(q);
        self
    }

    pub fn cond(&mut self, c: &Cond) -> &mut Sql {
        match c {
            Cond::Cmp(col, op, lit) => {
                self.push("(").ident(col).push(" ").push(op.sql()).push(" ");
                self.param(lit.clone()).push(")")
            }
            Cond::IsNull(col, null) => {
                self.push("(").ident(col);
                self.push(if *null { " IS NULL)" } else { " IS NOT NULL)" })
            }
            Cond::In(col, negated, items) => {
                self.push("(").ident(col);
                self.push(if *negated { " NOT IN (" } else { " IN (" });
                for (i, l) in items.iter().enumerate() {
                    if i > 0 {
                        self.push(", ");
                    }
                    self.param(l.clone());
                }
                self.push("))")
            }
            Cond::And(a, b) => self.push("(").cond(a).push(" AND ").cond(b).push(")"),
            Cond::Or(a, b) => self.push("(").cond(a).push(" OR ").cond(b).push(")"),
            Cond::Not(a) => self.push("(NOT ").cond(a).push(")"),
        }
    }

    /// A template as text: its columns cast to text and joined with its literal parts.
    /// Any NULL column makes the whole value NULL (a key that cannot be built).
    pub fn template(&mut self, t: &Template) -> &mut Sql {
        if let Some(c) = t.single_column() {
            return self.ident(c);
        }
        let cast = |s: &mut Sql, c: &str| {
            let ty = match s.dialect {
                Dialect::Postgres => "text",
                Dialect::Sqlite => "TEXT",
                Dialect::Mysql => "CHAR",
            };
            s.push("CAST(").ident(c).push(&format!(" AS {ty})"));
        };
        match self.dialect {
            Dialect::Mysql => {
                self.push("CONCAT(");
                for (i, p) in t.0.iter().enumerate() {
                    if i > 0 {
                        self.push(", ");
                    }
                    match p {
                        Piece::Text(s) => {
                            self.param(Lit::Text(s.clone()));
                        }
                        Piece::Column(c) => cast(self, c),
                    }
                }
                self.push(")")
            }
            _ => {
                self.push("(");
                for (i, p) in t.0.iter().enumerate() {
                    if i > 0 {
                        self.push(" || ");
                    }
                    match p {
                        Piece::Text(s) => {
                            if self.dialect == Dialect::Postgres {
                                self.push("CAST(");
                                self.param(Lit::Text(s.clone()));
                                self.push(" AS text)");
                            } else {
                                self.param(Lit::Text(s.clone()));
                            }
                        }
                        Piece::Column(c) => cast(self, c),
                    }
                }
                self.push(")")
            }
        }
    }

    /// A moment as epoch seconds (a number, or NULL).
    pub fn time(&mut self, t: &TimeSpec) -> &mut Sql {
        let plain = t.columns.len() == 1 && t.plus_secs == 0.0 && t.unit == TimeUnit::Epoch;
        if plain {
            return self.ident(&t.columns[0]);
        }
        self.push("(");
        let d = self.dialect;
        match (d, t.unit) {
            (_, TimeUnit::Epoch) => {}
            (Dialect::Postgres, TimeUnit::Timestamp) => {
                self.push("EXTRACT(EPOCH FROM ");
            }
            (Dialect::Mysql, TimeUnit::Timestamp) => {
                self.push("UNIX_TIMESTAMP(");
            }
            (Dialect::Sqlite, TimeUnit::Timestamp) => {
                self.push("(julianday(");
            }
        }
        if t.columns.len() == 1 {
            self.ident(&t.columns[0]);
        } else {
            self.push("COALESCE(");
            for (i, c) in t.columns.iter().enumerate() {
                if i > 0 {
                    self.push(", ");
                }
                self.ident(c);
            }
            self.push(")");
        }
        match (d, t.unit) {
            (_, TimeUnit::Epoch) => {}
            (Dialect::Sqlite, TimeUnit::Timestamp) => {
                self.push(") - 2440587.5) * 86400.0");
            }
            _ => {
                self.push(")");
            }
        }
        if t.plus_secs != 0.0 {
            // A number parsed from the settings and written by Rust, never their text.
            self.push(&format!(" + {:?}", t.plus_secs));
        }
        self.push(")")
    }

    /// The state word of a row: the column, or the first condition that holds.
    pub fn state(&mut self, s: &StateSpec) -> &mut Sql {
        match s {
            StateSpec::Column(c) => self.ident(c),
            StateSpec::Conditions(conds) => {
                self.push("(CASE");
                for (state, c) in conds {
                    // The state words are reckon's own constants.
                    self.push(" WHEN ")
                        .cond(c)
                        .push(&format!(" THEN '{state}'"));
                }
                self.push(&format!(" ELSE '{UNMATCHED}' END)"))
            }
        }
    }

    /// Whether a row is in one of the four states (the incremental scan's filter).
    pub fn known_state(&mut self, s: &StateSpec) -> &mut Sql {
        match s {
            StateSpec::Column(c) => self
                .ident(c)
                .push(" IN ('in_progress', 'succeeded', 'failed', 'unknown')"),
            StateSpec::Conditions(conds) => {
                self.push("(");
                for (i, (_, c)) in conds.iter().enumerate() {
                    if i > 0 {
                        self.push(" OR ");
                    }
                    self.cond(c);
                }
                self.push(")")
            }
        }
    }

    /// A key expression as the scan compares and orders it (bytes in SQLite and MySQL).
    pub fn key_bytes(&mut self, m: &Mapping) -> &mut Sql {
        match self.dialect {
            Dialect::Sqlite => self.push("CAST(").template(&m.key).push(" AS BLOB)"),
            Dialect::Postgres => self.template(&m.key),
            Dialect::Mysql => self.push("CAST(").template(&m.key).push(" AS BINARY)"),
        }
    }

    /// The select list, aliased as `scan.rs` decodes it.
    pub fn columns(&mut self, m: &Mapping) -> &mut Sql {
        match self.dialect {
            Dialect::Sqlite => self.sqlite_columns(m),
            Dialect::Postgres => self.pg_columns(m),
            Dialect::Mysql => self.mysql_columns(m),
        }
    }

    fn request_limit(m: &Mapping) -> &'static str {
        // A request held whole is fingerprinted after reading, so it is read up to the
        // response's limit; a stored hash only to one byte past its own.
        match m.request {
            Some(RequestSpec::Fingerprint(_)) => "1048577",
            _ => "1025",
        }
    }

    fn sqlite_columns(&mut self, m: &Mapping) -> &mut Sql {
        let text = |s: &mut Sql, f: &dyn Fn(&mut Sql), limit: &str, alias: &str| {
            s.push("substr(CAST(");
            f(s);
            s.push(&format!(" AS BLOB), 1, {limit}) AS {alias}, "));
        };
        text(
            self,
            &|s| {
                s.template(&m.key);
            },
            "4097",
            "k",
        );
        text(
            self,
            &|s| {
                s.state(&m.state);
            },
            "65",
            "st",
        );
        match &m.request {
            Some(RequestSpec::Hash(c) | RequestSpec::Fingerprint(c)) => {
                let limit = Self::request_limit(m);
                text(
                    self,
                    &|s| {
                        s.ident(c);
                    },
                    limit,
                    "rh",
                );
            }
            None => {
                self.push("CAST('' AS BLOB) AS rh, ");
            }
        }
        match &m.response {
            Some(c) => text(
                self,
                &|s| {
                    s.ident(c);
                },
                "1048577",
                "resp",
            ),
            None => {
                self.push("NULL AS resp, ");
            }
        }
        let num = |s: &mut Sql, f: &dyn Fn(&mut Sql), t: &str, i: &str, r: &str| {
            s.push("typeof(");
            f(s);
            s.push(&format!(") AS {t}, CASE WHEN typeof("));
            f(s);
            s.push(") = 'integer' THEN ");
            f(s);
            s.push(&format!(" END AS {i}, CASE WHEN typeof("));
            f(s);
            s.push(") = 'real' THEN ");
            f(s);
            s.push(&format!(" END AS {r}"));
        };
        match &m.attempts {
            Some(c) => num(
                self,
                &|s| {
                    s.ident(c);
                },
                "t_a",
                "i_a",
                "r_a",
            ),
            None => {
                self.push("'integer' AS t_a, 1 AS i_a, NULL AS r_a");
            }
        }
        self.push(", ");
        num(
            self,
            &|s| {
                s.time(&m.created_at);
            },
            "t_c",
            "i_c",
            "r_c",
        );
        self.push(", ");
        num(
            self,
            &|s| {
                s.time(&m.updated_at);
            },
            "t_u",
            "i_u",
            "r_u",
        );
        self.push(", ");
        match &m.lease_expires {
            Some(t) => num(
                self,
                &|s| {
                    s.time(t);
                },
                "t_e",
                "i_e",
                "r_e",
            ),
            None => {
                self.push("'null' AS t_e, NULL AS i_e, NULL AS r_e");
            }
        }
        self
    }

    fn pg_columns(&mut self, m: &Mapping) -> &mut Sql {
        self.push("left((")
            .template(&m.key)
            .push(")::text, 4097) AS k, ");
        self.push("left((")
            .state(&m.state)
            .push(")::text, 65) AS st, ");
        match &m.request {
            Some(RequestSpec::Hash(c) | RequestSpec::Fingerprint(c)) => {
                let limit = Self::request_limit(m);
                self.push("left(")
                    .ident(c)
                    .push(&format!("::text, {limit}) AS rh, "));
            }
            None => {
                self.push("''::text AS rh, ");
            }
        }
        match &m.response {
            Some(c) => {
                self.push("left(")
                    .ident(c)
                    .push("::text, 1048577) AS resp, ");
            }
            None => {
                self.push("NULL::text AS resp, ");
            }
        }
        match &m.attempts {
            Some(c) => {
                self.ident(c).push("::int8 AS a, ");
            }
            None => {
                self.push("1::int8 AS a, ");
            }
        }
        self.push("(").time(&m.created_at).push(")::float8 AS c, ");
        self.push("(").time(&m.updated_at).push(")::float8 AS u, ");
        match &m.lease_expires {
            Some(t) => self.push("(").time(t).push(")::float8 AS e"),
            None => self.push("NULL::float8 AS e"),
        }
    }

    fn mysql_columns(&mut self, m: &Mapping) -> &mut Sql {
        self.push("LEFT(CAST(")
            .template(&m.key)
            .push(" AS BINARY), 4097) AS k, ");
        self.push("LEFT(CAST(")
            .state(&m.state)
            .push(" AS BINARY), 65) AS st, ");
        match &m.request {
            Some(RequestSpec::Hash(c) | RequestSpec::Fingerprint(c)) => {
                let limit = Self::request_limit(m);
                self.push("LEFT(CAST(")
                    .ident(c)
                    .push(&format!(" AS BINARY), {limit}) AS rh, "));
            }
            None => {
                self.push("CAST('' AS BINARY) AS rh, ");
            }
        }
        match &m.response {
            Some(c) => {
                self.push("LEFT(CAST(")
                    .ident(c)
                    .push(" AS BINARY), 1048577) AS resp, ");
            }
            None => {
                self.push("CAST(NULL AS BINARY) AS resp, ");
            }
        }
        match &m.attempts {
            Some(c) => {
                self.push("CAST(").ident(c).push(" AS SIGNED) AS a, ");
            }
            None => {
                self.push("CAST(1 AS SIGNED) AS a, ");
            }
        }
        self.push("CAST(")
            .time(&m.created_at)
            .push(" AS DOUBLE) AS c, ");
        self.push("CAST(")
            .time(&m.updated_at)
            .push(" AS DOUBLE) AS u, ");
        match &m.lease_expires {
            Some(t) => self.push("CAST(").time(t).push(" AS DOUBLE) AS e"),
            None => self.push("CAST(NULL AS DOUBLE) AS e"),
        }
    }

    /// `FROM <table>`, quoted.
    pub fn from(&mut self, m: &Mapping) -> &mut Sql {
        let table = crate::scan::quote(self.dialect, &m.table);
        self.push(" FROM ").push(&table)
    }
}

/// The incremental (or full) read of a mapped table in `(updated_at, key)` order, as
/// `SourceConn::rows` reads justonce's.
pub(crate) fn rows(dialect: Dialect, m: &Mapping, since: Option<f64>, every_state: bool) -> Sql {
    let mut s = Sql::new(dialect);
    s.push("SELECT ").columns(m).from(m);
    if let Some(since) = since {
        s.push(" WHERE ");
        if every_state {
            s.time(&m.updated_at).push(" >= ").param(Lit::Real(since));
            s.push(" OR ").time(&m.updated_at).push(" IS NULL");
        } else {
            s.known_state(&m.state).push(" AND ");
            s.time(&m.updated_at).push(" >= ").param(Lit::Real(since));
        }
    }
    s.push(" ORDER BY ").time(&m.updated_at).push(", ");
    // Ties in the order the justonce reader breaks them: bytes in SQLite, the key's own
    // collation elsewhere.
    match dialect {
        Dialect::Sqlite => s.key_bytes(m),
        _ => s.template(&m.key),
    };
    s
}

/// Every key of a mapped table, as the justonce reader's `keys` reads them.
pub(crate) fn keys(dialect: Dialect, m: &Mapping) -> Sql {
    let mut s = Sql::new(dialect);
    match dialect {
        Dialect::Sqlite => s.push("SELECT substr(").key_bytes(m).push(", 1, 4097)"),
        Dialect::Postgres => s
            .push("SELECT left((")
            .template(&m.key)
            .push(")::text, 4097)"),
        Dialect::Mysql => s.push("SELECT LEFT(").key_bytes(m).push(", 4097)"),
    };
    s.from(m);
    s
}

/// The row of one key.
pub(crate) fn by_key(dialect: Dialect, m: &Mapping, key: Lit) -> Sql {
    let mut s = Sql::new(dialect);
    s.push("SELECT ").columns(m).from(m).push(" WHERE ");
    match dialect {
        Dialect::Sqlite => {
            s.template(&m.key)
                .push(" = CAST(")
                .param(key)
                .push(" AS TEXT)");
        }
        Dialect::Postgres => {
            s.push("(").template(&m.key).push(")::text = ").param(key);
        }
        Dialect::Mysql => {
            s.key_bytes(m).push(" = ").param(key);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::Mapping;
    use super::*;

    #[test]
    fn brandurs_conditions_render_with_quoted_columns_and_every_literal_bound() {
        let m = Mapping::preset("brandur").unwrap();
        let s = rows(Dialect::Postgres, &m, Some(100.0), false);
        assert!(s.text.contains(r#"("recovery_point" = $"#), "{}", s.text);
        assert!(!s.text.contains("'finished'"), "{}", s.text);
        assert!(s.text.contains("'unknown'"));
        assert!(s.params.contains(&Lit::Text("finished".into())));
        assert!(s.params.contains(&Lit::Int(500)));
        assert!(s.params.contains(&Lit::Real(100.0)));
        // Placeholders are numbered in the order the parameters were bound.
        assert!(s.text.contains(&format!("${}", s.params.len())));
        let my = rows(Dialect::Mysql, &m, None, true);
        assert_eq!(my.text.matches('?').count(), my.params.len());
        assert!(my.text.contains("`recovery_point`"));
        let key = by_key(
            Dialect::Sqlite,
            &m,
            Lit::Text("rocket-rides-atomic-1".into()),
        );
        assert!(key.text.contains(r#"(?"#), "{}", key.text);
        assert!(
            key.text.contains(r#" || CAST("id" AS TEXT))"#),
            "{}",
            key.text
        );
        assert!(
            key.params
                .contains(&Lit::Text("rocket-rides-atomic-".into()))
        );
    }

    #[test]
    fn the_justonce_preset_reads_the_columns_themselves() {
        let m = Mapping::preset("justonce").unwrap();
        let s = rows(Dialect::Postgres, &m, None, false);
        assert!(s.params.is_empty());
        assert!(
            s.text
                .ends_with(r#"FROM "justonce_keys" ORDER BY "updated_at", "key""#),
            "{}",
            s.text
        );
    }
}
