//! A transaction's [`Scope`]: what PostgreSQL's row-level security lets it see
//! ([`crate::driver::Driver::begin`] names it; SQLite has no RLS and ignores it). It stands
//! below the driver and the aggregates alike, and imports nothing of theirs.

use crate::model::TenantId;

/// What a transaction may see under PostgreSQL row-level security.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scope<'a> {
    /// Nothing of any tenant: tables without a tenant_id only.
    Global,
    Tenant(TenantId),
    /// The one token row with this hash (before its tenant is known).
    Token(&'a str),
    /// The one session row with this id hash.
    Session(&'a str),
    /// This user's memberships.
    User(i64),
}

impl Scope<'_> {
    /// (tenant, token, session, user) settings; '' for unset.
    pub(crate) fn settings(&self) -> (String, String, String, String) {
        let mut s = (String::new(), String::new(), String::new(), String::new());
        match *self {
            Scope::Global => {}
            Scope::Tenant(t) => s.0 = t.0.to_string(),
            Scope::Token(h) => s.1 = h.to_owned(),
            Scope::Session(h) => s.2 = h.to_owned(),
            Scope::User(u) => s.3 = u.to_string(),
        }
        s
    }
}
