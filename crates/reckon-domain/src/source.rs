use serde::Serialize;

/// The SQL dialect of a scanned source's database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    Sqlite,
    Postgres,
    Mysql,
}

impl Dialect {
    pub const ALL: [Dialect; 3] = [Dialect::Sqlite, Dialect::Postgres, Dialect::Mysql];

    pub fn as_str(self) -> &'static str {
        SourceKind::from(self).as_str()
    }

    pub fn parse(s: &str) -> Option<Dialect> {
        SourceKind::parse(s).and_then(SourceKind::dialect)
    }
}

/// How a source's records reach reckon: scanned from a database of one dialect, or pushed
/// through the API. Stored and sent as its word (`sqlite`, `postgres`, `mysql`, `push`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    Sqlite,
    Postgres,
    Mysql,
    Push,
}

impl SourceKind {
    pub const ALL: [SourceKind; 4] = [
        SourceKind::Sqlite,
        SourceKind::Postgres,
        SourceKind::Mysql,
        SourceKind::Push,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Sqlite => "sqlite",
            SourceKind::Postgres => "postgres",
            SourceKind::Mysql => "mysql",
            SourceKind::Push => "push",
        }
    }

    pub fn parse(s: &str) -> Option<SourceKind> {
        SourceKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    pub fn is_scanned(self) -> bool {
        self.dialect().is_some()
    }

    /// The database dialect a scanned source is read in; `None` for a push source.
    pub fn dialect(self) -> Option<Dialect> {
        match self {
            SourceKind::Sqlite => Some(Dialect::Sqlite),
            SourceKind::Postgres => Some(Dialect::Postgres),
            SourceKind::Mysql => Some(Dialect::Mysql),
            SourceKind::Push => None,
        }
    }
}

impl From<Dialect> for SourceKind {
    fn from(d: Dialect) -> SourceKind {
        match d {
            Dialect::Sqlite => SourceKind::Sqlite,
            Dialect::Postgres => SourceKind::Postgres,
            Dialect::Mysql => SourceKind::Mysql,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_and_dialect_reads_back_from_its_word_and_only_scanned_kinds_have_a_dialect() {
        for k in SourceKind::ALL {
            assert_eq!(SourceKind::parse(k.as_str()), Some(k));
            assert_eq!(k.is_scanned(), k != SourceKind::Push);
            if let Some(d) = k.dialect() {
                assert_eq!(SourceKind::from(d), k);
                assert_eq!(Dialect::parse(d.as_str()), Some(d));
            }
        }
        assert_eq!(Dialect::parse("push"), None);
        assert_eq!(SourceKind::parse("Postgres"), None);
        assert_eq!(Dialect::ALL.len(), 3);
    }
}
