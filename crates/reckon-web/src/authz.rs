//! The permission matrix: what each role may do, in one place. Every route names the
//! [`Permission`] it needs in the route registry (`routes.rs`); handlers and extractors ask
//! [`allows`] and nothing else decides.
//!
//! | role    | may                                                                       |
//! |---------|---------------------------------------------------------------------------|
//! | viewer  | summaries only: counts, ages, sources' health, quarantine counts          |
//! | support | viewer + records: effect lists, lookup, detail with history, quarantined  |
//! |         | rows, the unresolved queue; resolve with a note                           |
//! | finance | support + audits, exports, resolve manually (without a note)              |
//! | admin   | everything: sources, providers, users, write-back, tokens                 |
//!
//! No role reads a secret back: DSNs and provider keys are write-only for everyone.

use reckon_ledger::Role;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Permission {
    /// Summaries: counts, ages, sources' and providers' health, quarantine counts, routes,
    /// metrics. Nothing of a record (no key, no response body).
    Read,
    /// Records: effect lists and the unresolved queue, lookup by key or key part (an order
    /// id), detail and history, quarantined rows.
    Lookup,
    /// Mark an unresolved effect happened / not happened, with a note.
    ResolveWithNote,
    /// Resolve without a note, in bulk.
    ResolveManually,
    /// Double-charge audits.
    Audit,
    /// CSV / JSON exports of effects.
    Export,
    /// Add, edit, remove sources and push effects into the ledger.
    ManageSources,
    /// Add, edit, remove providers (their keys are write-only).
    ManageProviders,
    /// Write resolutions back into tenants' databases.
    WriteBack,
    /// Add people, change their roles, disable them.
    ManageUsers,
    /// Create, list and revoke API tokens.
    ManageTokens,
}

impl Permission {
    pub const ALL: [Permission; 11] = [
        Permission::Read,
        Permission::Lookup,
        Permission::ResolveWithNote,
        Permission::ResolveManually,
        Permission::Audit,
        Permission::Export,
        Permission::ManageSources,
        Permission::ManageProviders,
        Permission::WriteBack,
        Permission::ManageUsers,
        Permission::ManageTokens,
    ];

    /// The least role that has this permission. Roles are ordered (viewer < support <
    /// finance < admin) and each has everything the one below has, so this is the matrix.
    pub fn least_role(self) -> Role {
        match self {
            Permission::Read => Role::Viewer,
            Permission::Lookup | Permission::ResolveWithNote => Role::Support,
            Permission::ResolveManually | Permission::Audit | Permission::Export => Role::Finance,
            Permission::ManageSources
            | Permission::ManageProviders
            | Permission::WriteBack
            | Permission::ManageUsers
            | Permission::ManageTokens => Role::Admin,
        }
    }
}

/// May `role` do `permission`?
pub fn allows(role: Role, permission: Permission) -> bool {
    role >= permission.least_role()
}

pub const ROLES: [Role; 4] = [Role::Viewer, Role::Support, Role::Finance, Role::Admin];

#[cfg(test)]
mod tests {
    use super::*;
    use Permission as P;

    /// The matrix written out cell by cell, independently of `least_role`: a change to
    /// either fails here until both agree.
    const EXPECTED: [(Permission, [bool; 4]); 11] = [
        //                      viewer support finance admin
        (P::Read, [true, true, true, true]),
        (P::Lookup, [false, true, true, true]),
        (P::ResolveWithNote, [false, true, true, true]),
        (P::ResolveManually, [false, false, true, true]),
        (P::Audit, [false, false, true, true]),
        (P::Export, [false, false, true, true]),
        (P::ManageSources, [false, false, false, true]),
        (P::ManageProviders, [false, false, false, true]),
        (P::WriteBack, [false, false, false, true]),
        (P::ManageUsers, [false, false, false, true]),
        (P::ManageTokens, [false, false, false, true]),
    ];

    #[test]
    fn every_cell_of_the_matrix_is_as_documented() {
        assert_eq!(EXPECTED.len(), Permission::ALL.len());
        for (permission, row) in EXPECTED {
            assert!(Permission::ALL.contains(&permission));
            for (role, expected) in ROLES.into_iter().zip(row) {
                assert_eq!(
                    allows(role, permission),
                    expected,
                    "{} / {permission:?}",
                    role.as_str()
                );
            }
        }
    }

    #[test]
    fn each_role_has_everything_the_role_below_has() {
        for pair in ROLES.windows(2) {
            for p in Permission::ALL {
                assert!(!allows(pair[0], p) || allows(pair[1], p), "{p:?}");
            }
        }
    }

    #[test]
    fn only_admin_manages_tokens_users_sources_and_providers() {
        for p in [
            P::ManageTokens,
            P::ManageUsers,
            P::ManageSources,
            P::ManageProviders,
            P::WriteBack,
        ] {
            let holders: Vec<_> = ROLES.into_iter().filter(|r| allows(*r, p)).collect();
            assert_eq!(holders, vec![Role::Admin], "{p:?}");
        }
    }
}
