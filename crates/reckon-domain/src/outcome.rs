use serde::{Deserialize, Serialize};

/// The four outcome words of PRODUCT.md: what happened to one effect.
// When a provider's answer earns which word is `reckon-providers::classify`'s to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Applied,
    NotApplied,
    Duplicate,
    Indeterminate,
}

impl Outcome {
    pub const ALL: [Outcome; 4] = [
        Outcome::Applied,
        Outcome::NotApplied,
        Outcome::Duplicate,
        Outcome::Indeterminate,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::NotApplied => "not_applied",
            Outcome::Duplicate => "duplicate",
            Outcome::Indeterminate => "indeterminate",
        }
    }

    /// Strict parse: exactly one of the four words.
    pub fn parse(s: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.as_str() == s)
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Outcome {
    type Err = String;

    fn from_str(s: &str) -> Result<Outcome, String> {
        Outcome::parse(s).ok_or_else(|| {
            format!("outcome {s:?}: use applied, not_applied, duplicate or indeterminate")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_words_and_nothing_else_are_outcomes_in_text_and_json() {
        for o in Outcome::ALL {
            assert_eq!(Outcome::parse(o.as_str()), Some(o));
            assert_eq!(serde_json::to_value(o).unwrap(), o.as_str());
        }
        for not in ["maybe", "Applied", "applied ", "", "no_provider"] {
            assert_eq!(Outcome::parse(not), None, "{not:?}");
            assert!(not.parse::<Outcome>().unwrap_err().contains("use applied"));
        }
    }
}
