//! The words of write-back, as the ledger stores them and the API shows them.

use serde::Serialize;

/// What write-back does with a `not_applied` resolution: `release` deletes the row (the
/// application's retry can run), `fail` makes it `failed`. An `applied` one always becomes
/// `succeeded`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WritebackPolicy {
    /// Delete the row, so the application's retry of the same key can run.
    Release,
    /// Make the row `failed`: terminal, the key is burned.
    Fail,
}

impl WritebackPolicy {
    pub const ALL: [WritebackPolicy; 2] = [WritebackPolicy::Release, WritebackPolicy::Fail];

    pub fn as_str(self) -> &'static str {
        match self {
            WritebackPolicy::Release => "release",
            WritebackPolicy::Fail => "fail",
        }
    }

    pub fn parse(s: &str) -> Option<WritebackPolicy> {
        WritebackPolicy::ALL.into_iter().find(|w| w.as_str() == s)
    }
}

/// The change one write-back makes to the source row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WritebackAction {
    /// `state = 'succeeded'`, response = the provider object (applied).
    Succeed,
    /// Delete the row (not_applied, policy `release`).
    Release,
    /// `state = 'failed'` (not_applied, policy `fail`).
    Fail,
}

impl WritebackAction {
    pub const ALL: [WritebackAction; 3] = [
        WritebackAction::Succeed,
        WritebackAction::Release,
        WritebackAction::Fail,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WritebackAction::Succeed => "succeed",
            WritebackAction::Release => "release",
            WritebackAction::Fail => "fail",
        }
    }

    pub fn parse(s: &str) -> Option<WritebackAction> {
        WritebackAction::ALL.into_iter().find(|w| w.as_str() == s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WritebackStatus {
    /// The intent is recorded; whether the source was written is not known yet.
    Pending,
    /// The source row holds reckon's write (or, for a release, is gone).
    Written,
    /// The application moved first: the row was not what reckon saw; nothing was changed.
    Conflict,
}

impl WritebackStatus {
    pub const ALL: [WritebackStatus; 3] = [
        WritebackStatus::Pending,
        WritebackStatus::Written,
        WritebackStatus::Conflict,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WritebackStatus::Pending => "pending",
            WritebackStatus::Written => "written",
            WritebackStatus::Conflict => "conflict",
        }
    }

    pub fn parse(s: &str) -> Option<WritebackStatus> {
        WritebackStatus::ALL.into_iter().find(|w| w.as_str() == s)
    }
}

impl TryFrom<String> for WritebackAction {
    type Error = crate::UnknownWord;

    fn try_from(s: String) -> Result<WritebackAction, crate::UnknownWord> {
        crate::word(
            "write-back action",
            &WritebackAction::ALL,
            WritebackAction::as_str,
            &s,
        )
    }
}

impl TryFrom<String> for WritebackStatus {
    type Error = crate::UnknownWord;

    fn try_from(s: String) -> Result<WritebackStatus, crate::UnknownWord> {
        crate::word(
            "write-back status",
            &WritebackStatus::ALL,
            WritebackStatus::as_str,
            &s,
        )
    }
}
