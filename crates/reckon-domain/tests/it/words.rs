//! Each word of the product has one spelling: what the ledger stores (`as_str`, read back by
//! `parse`), what the API sends (serde) and what the API document lists (the schema's enum)
//! are the same words, every variant has one, and nothing else parses.

use reckon_domain::writeback::{WritebackAction, WritebackPolicy, WritebackStatus};
use reckon_domain::{Role, SourceKind};
use serde::Serialize;
use utoipa::PartialSchema;

/// The words an enum's schema lists, sorted.
fn schema_words<T: PartialSchema>() -> Vec<String> {
    let schema = serde_json::to_value(T::schema()).unwrap();
    let mut words: Vec<String> = schema["enum"]
        .as_array()
        .unwrap_or_else(|| panic!("not an enum schema: {schema}"))
        .iter()
        .map(|w| w.as_str().unwrap().to_owned())
        .collect();
    words.sort();
    words
}

/// Every variant's stored word parses back to it and is its JSON; the words are distinct;
/// near misses do not parse. Returns the words, sorted.
fn one_spelling<T: Copy + PartialEq + std::fmt::Debug + Serialize>(
    all: &[T],
    as_str: fn(T) -> &'static str,
    parse: fn(&str) -> Option<T>,
) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    for &v in all {
        let w = as_str(v);
        assert_eq!(parse(w), Some(v), "{w}");
        assert_eq!(serde_json::to_value(v).unwrap(), w, "{v:?}");
        for near in [w.to_uppercase(), format!("{w} "), format!(" {w}")] {
            assert_eq!(parse(&near), None, "{near:?}");
        }
        words.push(w.to_owned());
    }
    words.sort();
    let n = words.len();
    words.dedup();
    assert_eq!(words.len(), n, "two variants share a word");
    assert_eq!(parse(""), None);
    words
}

#[test]
fn a_role_has_one_spelling_in_the_ledger_the_api_and_its_document() {
    // A new role must be added to ALL (and decided here).
    for r in Role::ALL {
        match r {
            Role::Viewer | Role::Support | Role::Finance | Role::Admin => {}
        }
    }
    let words = one_spelling(&Role::ALL, Role::as_str, Role::parse);
    assert_eq!(words.len(), 4);
    assert_eq!(schema_words::<Role>(), words);
    assert!(Role::Viewer < Role::Support && Role::Support < Role::Finance);
    assert!(Role::Finance < Role::Admin);
}

#[test]
fn a_source_kind_has_one_spelling_in_the_ledger_the_api_and_its_document() {
    let words = one_spelling(&SourceKind::ALL, SourceKind::as_str, SourceKind::parse);
    assert_eq!(words, ["mysql", "postgres", "push", "sqlite"]);
    assert_eq!(schema_words::<SourceKind>(), words);
}

#[test]
fn the_write_back_words_have_one_spelling_in_the_ledger_the_api_and_its_document() {
    for p in WritebackPolicy::ALL {
        match p {
            WritebackPolicy::Release | WritebackPolicy::Fail => {}
        }
    }
    for a in WritebackAction::ALL {
        match a {
            WritebackAction::Succeed | WritebackAction::Release | WritebackAction::Fail => {}
        }
    }
    for s in WritebackStatus::ALL {
        match s {
            WritebackStatus::Pending | WritebackStatus::Written | WritebackStatus::Conflict => {}
        }
    }
    let policy = one_spelling(
        &WritebackPolicy::ALL,
        WritebackPolicy::as_str,
        WritebackPolicy::parse,
    );
    assert_eq!(policy, ["fail", "release"]);
    assert_eq!(schema_words::<WritebackPolicy>(), policy);
    let action = one_spelling(
        &WritebackAction::ALL,
        WritebackAction::as_str,
        WritebackAction::parse,
    );
    assert_eq!(action, ["fail", "release", "succeed"]);
    assert_eq!(schema_words::<WritebackAction>(), action);
    let status = one_spelling(
        &WritebackStatus::ALL,
        WritebackStatus::as_str,
        WritebackStatus::parse,
    );
    assert_eq!(status, ["conflict", "pending", "written"]);
}

#[test]
fn a_stored_word_reads_back_as_its_variant_and_anything_else_is_refused_with_the_words() {
    for r in Role::ALL {
        assert_eq!(Role::try_from(r.as_str().to_owned()), Ok(r));
    }
    let e = Role::try_from("owner".to_owned()).unwrap_err();
    assert_eq!((e.what, e.word.as_str()), ("role", "owner"));
    assert_eq!(
        e.to_string(),
        r#"role "owner" is not one of viewer, support, finance, admin"#
    );
    for a in WritebackAction::ALL {
        assert_eq!(WritebackAction::try_from(a.as_str().to_owned()), Ok(a));
    }
    for s in WritebackStatus::ALL {
        assert_eq!(WritebackStatus::try_from(s.as_str().to_owned()), Ok(s));
    }
    let e = WritebackStatus::try_from("Written".to_owned()).unwrap_err();
    assert_eq!(e.words, ["pending", "written", "conflict"]);
    assert_eq!(
        e.to_string(),
        r#"write-back status "Written" is not one of pending, written, conflict"#
    );
}
