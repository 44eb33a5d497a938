use serde::{Deserialize, Serialize};

/// Where a provider's charge stands, in reckon's words. Each adapter maps its provider's own
/// (Stripe: a captured `succeeded` charge is paid, an uncaptured one authorised); the audit
/// reads only these. Stored (the ledger's `provider_charge.status`, an audit finding's
/// charges) as the word it has always been stored as, so ledgers and audit runs written
/// before read back unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ChargeStatus {
    /// Money was taken (captured). A refund later does not undo it.
    #[serde(rename = "succeeded")]
    Paid,
    /// Held on the card, not captured: no money has moved yet.
    #[serde(rename = "authorized")]
    Authorized,
    /// Not settled, or a state the provider did not make plain: money may still move.
    #[serde(rename = "pending")]
    Pending,
    /// The attempt ended without money.
    #[serde(rename = "failed")]
    Failed,
}

impl ChargeStatus {
    pub const ALL: [ChargeStatus; 4] = [
        ChargeStatus::Paid,
        ChargeStatus::Authorized,
        ChargeStatus::Pending,
        ChargeStatus::Failed,
    ];

    /// The stored word.
    pub fn as_str(self) -> &'static str {
        match self {
            ChargeStatus::Paid => "succeeded",
            ChargeStatus::Authorized => "authorized",
            ChargeStatus::Pending => "pending",
            ChargeStatus::Failed => "failed",
        }
    }

    /// A stored word read back. A word no adapter writes (stored by an older version from an
    /// http provider's own vocabulary) is `Pending`: neither paid nor failed, as the audit
    /// always counted it.
    pub fn from_stored(word: &str) -> ChargeStatus {
        ChargeStatus::ALL
            .into_iter()
            .find(|s| s.as_str() == word)
            .unwrap_or(ChargeStatus::Pending)
    }

    pub fn is_paid(self) -> bool {
        self == ChargeStatus::Paid
    }
}

impl std::fmt::Display for ChargeStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_reads_back_from_its_stored_word_and_an_unknown_word_is_pending() {
        for s in ChargeStatus::ALL {
            assert_eq!(ChargeStatus::from_stored(s.as_str()), s);
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::Value::String(s.as_str().to_owned())
            );
        }
        assert_eq!(ChargeStatus::Paid.as_str(), "succeeded");
        assert_eq!(
            ChargeStatus::from_stored("processing"),
            ChargeStatus::Pending
        );
        assert!(!ChargeStatus::from_stored("paid").is_paid());
    }
}
