//! The ids an application recorded in its own row: the result justonce stores after the
//! call (`{"charge_id": "ch_…"}`, `{"id": "pi_…", "latest_charge": "ch_…"}`, a receipt's
//! `message_id`). Support searches by them, since they are what the application showed the
//! customer (a receipt, an order page); the lookup and ingest read them with this one rule.

use serde::Deserialize;
use serde::de::IgnoredAny;
use std::borrow::Cow;

/// The result fields that name an object of a provider (a payment, a refund, an email).
pub const ID_FIELDS: &[&str] = &[
    "id",
    "charge_id",
    "charge",
    "latest_charge",
    "payment_intent",
    "payment_intent_id",
    "refund_id",
    "receipt_id",
    "message_id",
    "invoice_id",
    "transfer_id",
];

/// At most this many ids are kept of one row (a result naming dozens is not one effect's).
const MAX_IDS: usize = 8;

/// A field that is a string when it names an id, and anything else (an expanded object, a
/// number) otherwise: the other shapes are skipped, never an error.
#[derive(Deserialize)]
#[serde(untagged)]
enum Field<'a> {
    Text(#[serde(borrow)] Cow<'a, str>),
    Other(IgnoredAny),
}

#[derive(Deserialize)]
struct Ids<'a> {
    #[serde(borrow, default)]
    id: Option<Field<'a>>,
    #[serde(borrow, default)]
    charge_id: Option<Field<'a>>,
    #[serde(borrow, default)]
    charge: Option<Field<'a>>,
    #[serde(borrow, default)]
    latest_charge: Option<Field<'a>>,
    #[serde(borrow, default)]
    payment_intent: Option<Field<'a>>,
    #[serde(borrow, default)]
    payment_intent_id: Option<Field<'a>>,
    #[serde(borrow, default)]
    refund_id: Option<Field<'a>>,
    #[serde(borrow, default)]
    receipt_id: Option<Field<'a>>,
    #[serde(borrow, default)]
    message_id: Option<Field<'a>>,
    #[serde(borrow, default)]
    invoice_id: Option<Field<'a>>,
    #[serde(borrow, default)]
    transfer_id: Option<Field<'a>>,
}

/// Whether `s` reads as an object id: one word of 4 to 128 printable ASCII characters
/// (no spaces), holding a digit or an underscore, so "done" or "succeeded" is not one.
fn id_like(s: &str) -> bool {
    (4..=128).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_graphic())
        && s.bytes().any(|b| b.is_ascii_digit() || b == b'_')
}

/// The ids `response` (the row's recorded result, JSON) names in [`ID_FIELDS`], in that
/// order, each once. Anything that is not a JSON object gives none.
pub fn recorded_ids(response: &str) -> Vec<String> {
    if !response.trim_start().starts_with('{') {
        return Vec::new();
    }
    let Ok(v) = serde_json::from_str::<Ids<'_>>(response) else {
        return Vec::new();
    };
    let mut out: Vec<String> = Vec::new();
    for f in [
        v.id,
        v.charge_id,
        v.charge,
        v.latest_charge,
        v.payment_intent,
        v.payment_intent_id,
        v.refund_id,
        v.receipt_id,
        v.message_id,
        v.invoice_id,
        v.transfer_id,
    ]
    .into_iter()
    .flatten()
    {
        if let Field::Text(s) = f
            && id_like(&s)
            && !out.iter().any(|x| *x == *s)
            && out.len() < MAX_IDS
        {
            out.push(s.into_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_from_the_named_fields_only() {
        assert_eq!(
            recorded_ids(r#"{"charge_id": "ch_demo_17", "amount": 2000, "status": "succeeded"}"#),
            ["ch_demo_17"]
        );
        assert_eq!(
            recorded_ids(r#"{"id": "pi_1", "latest_charge": "ch_1", "customer": "cus_9"}"#),
            ["pi_1", "ch_1"]
        );
        assert_eq!(
            recorded_ids(r#"{"message_id": "msg_0042", "to": "a@b.test"}"#),
            ["msg_0042"]
        );
    }

    #[test]
    fn other_shapes_give_nothing_and_never_fail() {
        assert!(recorded_ids(r#""done""#).is_empty());
        assert!(recorded_ids("not json").is_empty());
        assert!(recorded_ids(r#"{"id": "done"}"#).is_empty());
        assert!(recorded_ids(r#"{"id": "has space 1"}"#).is_empty());
        assert_eq!(
            recorded_ids(r#"{"charge": {"id": "ch_x"}, "refund_id": "re_1"}"#),
            ["re_1"]
        );
        assert_eq!(
            recorded_ids(r#"{"id": 17, "charge_id": "ch\u005f2"}"#),
            ["ch_2"]
        );
    }
}
