use serde::{Deserialize, Serialize};

/// The state column of a justonce row. Anything else is not guessed at: the row is
/// quarantined (`QuarantineReason::UnknownState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = EffectState)]
pub enum State {
    InProgress,
    Succeeded,
    Failed,
    Unknown,
}

impl State {
    pub const ALL: [State; 4] = [
        State::InProgress,
        State::Succeeded,
        State::Failed,
        State::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::InProgress => "in_progress",
            State::Succeeded => "succeeded",
            State::Failed => "failed",
            State::Unknown => "unknown",
        }
    }

    /// Strict parse: the exact lower-case words justonce writes.
    pub fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an effect is unresolved: nobody knows whether it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UnresolvedKind {
    /// The application marked it `unknown`: the call ran, recording its outcome failed.
    Unknown,
    /// An `in_progress` claim whose lease ran out more than the source's grace period ago:
    /// its worker must be dead. justonce's own `unresolved()` does not list these.
    Abandoned,
}

impl UnresolvedKind {
    pub fn as_str(self) -> &'static str {
        match self {
            UnresolvedKind::Unknown => "unknown",
            UnresolvedKind::Abandoned => "abandoned",
        }
    }

    /// Derive the kind from what the source says and the current time.
    ///
    /// `gone` effects (the row left the source) are never abandoned: justonce deletes an
    /// `in_progress` row only when the claim is released after a transient failure, which
    /// means the effect did not happen. An `unknown` row that vanished stays unresolved:
    /// deleting the record answers nothing.
    pub fn derive(
        state: State,
        expires_at: Option<f64>,
        gone: bool,
        abandoned_after_secs: f64,
        now: f64,
    ) -> Option<UnresolvedKind> {
        match state {
            State::Unknown => Some(UnresolvedKind::Unknown),
            State::InProgress if !gone => match expires_at {
                Some(lease_end) if lease_end + abandoned_after_secs <= now => {
                    Some(UnresolvedKind::Abandoned)
                }
                _ => None,
            },
            _ => None,
        }
    }
}

/// What reckon concludes when a row it had seen is no longer in the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Disappearance {
    /// A `succeeded` or `failed` row: the application's `sweep` removed it.
    Swept,
    /// An `in_progress` row: justonce deletes a claim on a transient failure so that a
    /// retry can claim again.
    Released,
    /// An `unknown` row: justonce never deletes these, so something else did.
    Vanished,
}

impl Disappearance {
    pub fn for_last_state(state: State) -> Disappearance {
        match state {
            State::Succeeded | State::Failed => Disappearance::Swept,
            State::InProgress => Disappearance::Released,
            State::Unknown => Disappearance::Vanished,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Disappearance::Swept => "swept",
            Disappearance::Released => "released",
            Disappearance::Vanished => "vanished",
        }
    }

    pub fn parse(s: &str) -> Option<Disappearance> {
        [
            Disappearance::Swept,
            Disappearance::Released,
            Disappearance::Vanished,
        ]
        .into_iter()
        .find(|d| d.as_str() == s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_parse_strictly() {
        for s in State::ALL {
            assert_eq!(State::parse(s.as_str()), Some(s));
        }
        assert_eq!(State::parse("UNKNOWN"), None);
        assert_eq!(State::parse("partially_refunded"), None);
        assert_eq!(State::parse(""), None);
    }

    #[test]
    fn a_claim_is_abandoned_only_after_lease_plus_grace() {
        let lease_end = 1000.0;
        let grace = 300.0;
        let d = |now| UnresolvedKind::derive(State::InProgress, Some(lease_end), false, grace, now);
        assert_eq!(d(999.0), None, "lease still valid");
        assert_eq!(d(1200.0), None, "lease ran out but within grace");
        assert_eq!(d(1300.0), Some(UnresolvedKind::Abandoned));
        assert_eq!(
            UnresolvedKind::derive(State::InProgress, Some(lease_end), true, grace, 5000.0),
            None,
            "a released claim is not abandoned"
        );
    }

    #[test]
    fn unknown_is_unresolved_even_when_gone_and_terminal_states_never_are() {
        assert_eq!(
            UnresolvedKind::derive(State::Unknown, None, true, 300.0, 0.0),
            Some(UnresolvedKind::Unknown)
        );
        for s in [State::Succeeded, State::Failed] {
            assert_eq!(UnresolvedKind::derive(s, Some(0.0), false, 0.0, 1e9), None);
        }
    }
}
