//! A mapping held against its live table, before a source is saved: every column it names
//! exists and has a type its use can read, the whole read compiles, each condition runs
//! (inside the connection's read-only transaction; a condition cannot write by its
//! grammar), no row has two states or shares its key, and how many rows each state's
//! condition matches is shown. The first problem found is the answer, as a sentence naming
//! the field and the column.

use super::cond::{Cond, Lit};
use super::render::Sql;
use super::{Mapping, MappingCheck, MappingError, RequestSpec, STATES, StateSpec, TimeUnit};
use crate::dsn::Dialect;
use crate::scan::{Inner, SourceConn, bind_lits, describe};
use sqlx::{AssertSqlSafe, Row};

/// What a column's declared type lets a mapping do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Number,
    Bool,
    Time,
    Json,
    /// SQLite: any column holds any value, so nothing is refused by type.
    Any,
    Other,
}

fn kind(dialect: Dialect, ty: &str) -> Kind {
    let t = ty.to_ascii_lowercase();
    match dialect {
        Dialect::Sqlite => Kind::Any,
        Dialect::Postgres => {
            if t == "text"
                || t.starts_with("character")
                || t.starts_with("varchar")
                || t == "citext"
            {
                Kind::Text
            } else if ["smallint", "integer", "bigint", "real", "double precision"]
                .contains(&t.as_str())
                || t.starts_with("numeric")
            {
                Kind::Number
            } else if t == "boolean" {
                Kind::Bool
            } else if t.starts_with("timestamp") || t == "date" {
                Kind::Time
            } else if t == "json" || t == "jsonb" {
                Kind::Json
            } else {
                Kind::Other
            }
        }
        Dialect::Mysql => match t.as_str() {
            "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" | "enum"
            | "set" => Kind::Text,
            "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint" | "decimal"
            | "float" | "double" => Kind::Number,
            "datetime" | "timestamp" | "date" => Kind::Time,
            "json" => Kind::Json,
            _ => Kind::Other,
        },
    }
}

fn lit_fits(dialect: Dialect, k: Kind, l: &Lit) -> bool {
    match (k, l) {
        (Kind::Any, _) => true,
        (Kind::Text, Lit::Text(_)) => true,
        (Kind::Number, Lit::Int(_) | Lit::Real(_)) => true,
        // MySQL's booleans are TINYINT.
        (Kind::Number, Lit::Bool(_)) => dialect == Dialect::Mysql,
        (Kind::Bool, Lit::Bool(_)) => true,
        _ => false,
    }
}

fn lit_words(l: &Lit) -> String {
    match l {
        Lit::Text(_) => format!("the text {l}"),
        Lit::Int(_) | Lit::Real(_) => format!("the number {l}"),
        Lit::Bool(_) => format!("the boolean {l}"),
        Lit::Bytes(_) => format!("{l}"),
    }
}

struct Columns {
    dialect: Dialect,
    list: Vec<(String, String)>,
}

impl Columns {
    fn find(&self, name: &str) -> Option<&(String, String)> {
        self.list.iter().find(|(n, _)| match self.dialect {
            Dialect::Postgres => n == name,
            _ => n.eq_ignore_ascii_case(name),
        })
    }

    fn names(&self) -> String {
        let mut s: Vec<&str> = self.list.iter().take(30).map(|(n, _)| n.as_str()).collect();
        if self.list.len() > 30 {
            s.push("…");
        }
        s.join(", ")
    }

    fn kind(&self, name: &str) -> (Kind, String) {
        let (_, ty) = self.find(name).expect("columns were checked to exist");
        (kind(self.dialect, ty), ty.clone())
    }

    fn check_cond(&self, state: &str, c: &Cond) -> Result<(), MappingError> {
        let refuse = |col: &str, ty: &str, l: &Lit| {
            Err(MappingError::Column(format!(
                "the {state} condition compares the column \"{col}\" ({ty}) with {}, which \
                 it cannot hold",
                lit_words(l)
            )))
        };
        match c {
            Cond::Cmp(col, _, l) => {
                let (k, ty) = self.kind(col);
                if !lit_fits(self.dialect, k, l) {
                    return refuse(col, &ty, l);
                }
            }
            Cond::In(col, _, items) => {
                let (k, ty) = self.kind(col);
                if let Some(l) = items.iter().find(|l| !lit_fits(self.dialect, k, l)) {
                    return refuse(col, &ty, l);
                }
            }
            Cond::IsNull(..) => {}
            Cond::And(a, b) | Cond::Or(a, b) => {
                self.check_cond(state, a)?;
                self.check_cond(state, b)?;
            }
            Cond::Not(a) => self.check_cond(state, a)?,
        }
        Ok(())
    }
}

/// The uses a mapping makes of its columns, each refused by a sentence when the column's
/// type cannot serve it.
fn check_types(m: &Mapping, cols: &Columns) -> Result<(), MappingError> {
    for c in m.key.columns() {
        let (k, ty) = cols.kind(c);
        if k == Kind::Time {
            return Err(MappingError::Column(format!(
                "the mapping's key uses the column \"{c}\" ({ty}), whose text depends on the \
                 session's time zone: a key must not"
            )));
        }
    }
    match &m.state {
        StateSpec::Column(c) => {
            let (k, ty) = cols.kind(c);
            if !matches!(k, Kind::Text | Kind::Any) {
                return Err(MappingError::Column(format!(
                    "the mapping's state reads the column \"{c}\" ({ty}), which cannot hold \
                     the words in_progress, succeeded, failed, unknown"
                )));
            }
        }
        StateSpec::Conditions(conds) => {
            for (state, c) in conds {
                cols.check_cond(state, c)?;
            }
        }
    }
    for (field, t) in [
        ("created_at", Some(&m.created_at)),
        ("updated_at", Some(&m.updated_at)),
        ("lease_expires", m.lease_expires.as_ref()),
    ] {
        let Some(t) = t else { continue };
        for c in &t.columns {
            let (k, ty) = cols.kind(c);
            match (t.unit, k) {
                (_, Kind::Any)
                | (TimeUnit::Epoch, Kind::Number)
                | (TimeUnit::Timestamp, Kind::Time) => {}
                (TimeUnit::Epoch, Kind::Time) => {
                    return Err(MappingError::Column(format!(
                        "the mapping's {field} reads the column \"{c}\" as epoch seconds, but \
                         it is {ty} (say \"unit\": \"timestamp\")"
                    )));
                }
                (TimeUnit::Timestamp, Kind::Number) => {
                    return Err(MappingError::Column(format!(
                        "the mapping's {field} reads the column \"{c}\" as a timestamp, but it \
                         is {ty} (say \"unit\": \"epoch\")"
                    )));
                }
                _ => {
                    return Err(MappingError::Column(format!(
                        "the mapping's {field} reads the column \"{c}\" as a moment, but it is \
                         {ty}, neither a timestamp nor a number"
                    )));
                }
            }
        }
    }
    if let Some(c) = &m.attempts {
        let (k, ty) = cols.kind(c);
        if !matches!(k, Kind::Number | Kind::Any) {
            return Err(MappingError::Column(format!(
                "the mapping's attempts reads the column \"{c}\" ({ty}), which is not a number"
            )));
        }
    }
    let texts = [
        match &m.request {
            Some(RequestSpec::Hash(c)) => Some(("request_hash", c)),
            Some(RequestSpec::Fingerprint(c)) => Some(("request", c)),
            None => None,
        },
        m.response.as_ref().map(|c| ("response", c)),
    ];
    for (field, c) in texts.into_iter().flatten() {
        let (k, ty) = cols.kind(c);
        // A request column is read as text whatever its type; a response must be JSON text.
        if field == "response" && !matches!(k, Kind::Any | Kind::Json | Kind::Text) {
            return Err(MappingError::Column(format!(
                "the mapping's response reads the column \"{c}\" ({ty}), which does not hold \
                 JSON text"
            )));
        }
    }
    Ok(())
}

macro_rules! count_rows {
    ($conn:expr, $sql:expr) => {{
        let sql: Sql = $sql;
        match $conn {
            Inner::Sqlite(c) => bind_lits!(sqlx::query(AssertSqlSafe(sql.text)), &sql.params)
                .fetch_one(&mut *c)
                .await
                .and_then(|r| {
                    (0..r.len())
                        .map(|i| r.try_get::<i64, _>(i))
                        .collect::<Result<Vec<i64>, _>>()
                }),
            Inner::Postgres(c) => bind_lits!(sqlx::query(AssertSqlSafe(sql.text)), &sql.params)
                .fetch_one(&mut *c)
                .await
                .and_then(|r| {
                    (0..r.len())
                        .map(|i| r.try_get::<i64, _>(i))
                        .collect::<Result<Vec<i64>, _>>()
                }),
            Inner::Mysql(c) => bind_lits!(sqlx::query(AssertSqlSafe(sql.text)), &sql.params)
                .fetch_one(&mut *c)
                .await
                .and_then(|r| {
                    (0..r.len())
                        .map(|i| r.try_get::<i64, _>(i))
                        .collect::<Result<Vec<i64>, _>>()
                }),
        }
    }};
}

impl SourceConn {
    /// Hold this connection's mapping against its table (see the module's comment). Run
    /// on a connection opened for it: after a failed statement a PostgreSQL transaction
    /// reads nothing more.
    pub async fn check_mapping(&mut self) -> Result<MappingCheck, MappingError> {
        let dialect = self.dialect();
        let m = self.mapping().cloned().ok_or_else(|| {
            MappingError::Query("the source is not read through a mapping".into())
        })?;
        let cols = self.table_columns(&m.table).await?;
        if cols.list.is_empty() {
            return Err(MappingError::NoSuchTable(m.table.clone()));
        }
        for (field, c) in m.columns() {
            if cols.find(c).is_none() {
                return Err(MappingError::NoSuchColumn {
                    field,
                    column: c.to_owned(),
                    table: m.table.clone(),
                    columns: cols.names(),
                });
            }
        }
        check_types(&m, &cols)?;

        // The whole read compiles.
        let mut s = Sql::new(dialect);
        s.push("SELECT ").columns(&m).from(&m).push(" LIMIT 1");
        let sql = s;
        let read = match &mut self.inner {
            Inner::Sqlite(c) => bind_lits!(sqlx::query(AssertSqlSafe(sql.text)), &sql.params)
                .fetch_optional(&mut *c)
                .await
                .map(|_| ()),
            Inner::Postgres(c) => bind_lits!(sqlx::query(AssertSqlSafe(sql.text)), &sql.params)
                .fetch_optional(&mut *c)
                .await
                .map(|_| ()),
            Inner::Mysql(c) => bind_lits!(sqlx::query(AssertSqlSafe(sql.text)), &sql.params)
                .fetch_optional(&mut *c)
                .await
                .map(|_| ()),
        };
        read.map_err(|e| {
            MappingError::Query(format!(
                "reading the table {} failed: {}",
                m.table,
                describe(&e)
            ))
        })?;

        // Each state's rows, one statement per condition so a failure names its state.
        let conds: Vec<(&'static str, Sql)> = STATES
            .iter()
            .map(|state| {
                let mut s = Sql::new(dialect);
                s.push("SELECT COUNT(*)").from(&m).push(" WHERE ");
                match &m.state {
                    StateSpec::Column(c) => {
                        s.ident(c).push(" = ").param(Lit::Text((*state).to_owned()));
                    }
                    StateSpec::Conditions(conds) => {
                        let (_, c) = conds.iter().find(|(n, _)| n == state).expect("four states");
                        s.cond(c);
                    }
                }
                (*state, s)
            })
            .collect();
        let mut states = Vec::new();
        for (state, sql) in conds {
            let n = count_rows!(&mut self.inner, sql).map_err(|e| MappingError::Runs {
                state,
                table: m.table.clone(),
                message: describe(&e),
            })?;
            states.push((state.to_owned(), n[0]));
        }

        // Rows in two states, and keys two rows share.
        let mut s = Sql::new(dialect);
        s.push("SELECT COUNT(*), COUNT(DISTINCT ")
            .key_bytes(&m)
            .push(")");
        let mut pairs = Vec::new();
        if let StateSpec::Conditions(conds) = &m.state {
            for i in 0..conds.len() {
                for j in i + 1..conds.len() {
                    s.push(", COUNT(CASE WHEN ").cond(&conds[i].1).push(" AND ");
                    s.cond(&conds[j].1).push(" THEN 1 END)");
                    pairs.push((conds[i].0, conds[j].0));
                }
            }
        }
        s.push(", COUNT(CASE WHEN ")
            .state(&m.state)
            .push(" IN ('unknown', 'in_progress', 'failed', 'succeeded') THEN NULL ELSE 1 END)");
        s.from(&m);
        let n = count_rows!(&mut self.inner, s)
            .map_err(|e| MappingError::Query(format!("{} ({})", m.table, describe(&e))))?;
        let (rows, distinct) = (n[0], n[1]);
        for (k, (a, b)) in pairs.iter().enumerate() {
            let both = n[2 + k];
            if both > 0 {
                return Err(MappingError::Overlap(format!(
                    "{both} rows of {} match both the {a} and the {b} conditions: each row \
                     must have one state",
                    m.table
                )));
            }
        }
        let unmatched = n[2 + pairs.len()];
        if distinct < rows {
            return Err(MappingError::Column(format!(
                "the mapping's key {} does not identify a row of {}: {} rows share a key \
                 with another (or build no key, a column of it being NULL)",
                m.key,
                m.table,
                rows - distinct
            )));
        }
        Ok(MappingCheck {
            table: m.table.clone(),
            rows,
            states,
            unmatched,
        })
    }

    async fn table_columns(&mut self, table: &str) -> Result<Columns, MappingError> {
        let dialect = self.dialect();
        let (schema, name) = match table.split_once('.') {
            Some((s, t)) => (Some(s.to_owned()), t.to_owned()),
            None => (None, table.to_owned()),
        };
        let q = |e: sqlx::Error| MappingError::Query(describe(&e));
        let list: Vec<(String, String)> = match &mut self.inner {
            Inner::Postgres(c) => sqlx::query(
                "SELECT a.attname::text, pg_catalog.format_type(a.atttypid, a.atttypmod) \
                 FROM pg_catalog.pg_attribute a \
                 WHERE a.attrelid = pg_catalog.to_regclass($1) AND a.attnum > 0 \
                 AND NOT a.attisdropped ORDER BY a.attnum",
            )
            .bind(crate::scan::quote(Dialect::Postgres, table))
            .fetch_all(&mut *c)
            .await
            .map_err(q)?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(q)?,
            Inner::Mysql(c) => sqlx::query(
                "SELECT CAST(column_name AS CHAR), CAST(data_type AS CHAR) \
                 FROM information_schema.columns \
                 WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ? \
                 ORDER BY ordinal_position",
            )
            .bind(schema)
            .bind(name)
            .fetch_all(&mut *c)
            .await
            .map_err(q)?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(q)?,
            Inner::Sqlite(c) => {
                sqlx::query("SELECT name, type FROM pragma_table_info(?1, COALESCE(?2, 'main'))")
                    .bind(name)
                    .bind(schema)
                    .fetch_all(&mut *c)
                    .await
                    .map_err(q)?
                    .iter()
                    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                    .collect::<Result<_, sqlx::Error>>()
                    .map_err(q)?
            }
        };
        Ok(Columns { dialect, list })
    }
}
