use serde::Serialize;

/// A role within one tenant, least to most: each may do what the roles before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Viewer,
    Support,
    Finance,
    Admin,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Viewer, Role::Support, Role::Finance, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Support => "support",
            Role::Finance => "finance",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl TryFrom<String> for Role {
    type Error = crate::UnknownWord;

    fn try_from(s: String) -> Result<Role, crate::UnknownWord> {
        crate::word("role", &Role::ALL, Role::as_str, &s)
    }
}
