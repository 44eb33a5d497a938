//! State changes made the same way from every surface: validate, check the egress policy,
//! store, and write the tenant's audit-log line. The CLI, the API and the dashboard differ
//! only in who acts, through which surface, and how they show a refusal; what is checked,
//! stored and logged is decided here once.

use crate::source_input::{SourceEdit, SourceInput, check_dsn_at_save, new_source, source_change};
use reckon_ledger::{Ledger, LedgerError, NewAction, Source, Tenant};
use reckon_sources::EgressPolicy;
use serde_json::{Value, json};

/// The surface a person acted through; the audit log names it (`detail.via`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Cli,
    Api,
    Dashboard,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Cli => "cli",
            Via::Api => "api",
            Via::Dashboard => "dashboard",
        }
    }
}

/// Who changes what, through which surface.
pub struct Ctx<'a> {
    pub ledger: &'a dyn Ledger,
    pub egress: &'a EgressPolicy,
    pub tenant: &'a Tenant,
    /// As the audit log names them: `operator` (the CLI), `token:N`, `user:N via token:M`,
    /// `user:<email>`.
    pub actor: String,
    pub via: Via,
}

/// Why a command changed nothing. The sentences are for the person who asked and never
/// hold a secret: the input checks quote no DSN beyond its host.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("{0}")]
    Invalid(String),
    #[error("a source named {0:?} already exists")]
    Exists(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl Ctx<'_> {
    /// The change is committed before it is logged, so a failed log write is reported
    /// loudly rather than turned into an error the caller would read as "not done".
    async fn log(&self, action: &str, target: &str, mut detail: Value) {
        detail["via"] = json!(self.via.as_str());
        let new = NewAction {
            actor: self.actor.clone(),
            action: action.to_owned(),
            target: Some(target.to_owned()),
            detail,
            address: None,
        };
        if let Err(e) = self.ledger.record_action(self.tenant.id, new).await {
            tracing::error!(error = %e, action, "could not write the audit log");
        }
    }
}

/// Add a source (`source.add`).
pub async fn add_source(c: &Ctx<'_>, input: SourceInput) -> Result<Source, CommandError> {
    let name = input.name.clone();
    let new = new_source(input).map_err(CommandError::Invalid)?;
    check_dsn_at_save(new.kind, new.dsn.as_ref(), c.egress, &c.tenant.slug)
        .await
        .map_err(CommandError::Invalid)?;
    let source = c
        .ledger
        .add_source(c.tenant.id, new)
        .await
        .map_err(|e| match e {
            LedgerError::Conflict(_) => CommandError::Exists(name),
            other => other.into(),
        })?;
    c.log(
        "source.add",
        &source.name,
        json!({ "kind": source.kind.as_str() }),
    )
    .await;
    Ok(source)
}

/// Change a source's settings (`source.edit`): fields left out keep their stored value; a
/// DSN without a password keeps the stored one; a new DSN is checked like one added.
/// `NotFound` for a name the tenant has no source of, before the edit is looked at.
pub async fn edit_source(
    c: &Ctx<'_>,
    name: &str,
    edit: SourceEdit,
) -> Result<Source, CommandError> {
    let source = c.ledger.source_by_name(c.tenant.id, name).await?;
    let fields = edit.fields();
    if fields.is_empty() {
        return Err(CommandError::Invalid(
            "nothing to change: give at least one of dsn, password, table, scan_interval, \
             abandoned_after, overlap, full_scan_every"
                .into(),
        ));
    }
    let stored = if source.kind.is_scanned() && (edit.dsn.is_some() || edit.password.is_some()) {
        Some(c.ledger.source_dsn(c.tenant.id, &source).await?)
    } else {
        None
    };
    // The refusals are never matched against the stored password (an answer that changed
    // when a guess equalled it would reveal it).
    let change =
        source_change(source.kind, stored.as_ref(), edit).map_err(CommandError::Invalid)?;
    check_dsn_at_save(source.kind, change.dsn.as_ref(), c.egress, &c.tenant.slug)
        .await
        .map_err(CommandError::Invalid)?;
    let dsn_changed = change.dsn.is_some();
    let source = c.ledger.update_source(c.tenant.id, name, change).await?;
    c.log(
        "source.edit",
        &source.name,
        json!({ "fields": fields, "dsn_changed": dsn_changed }),
    )
    .await;
    Ok(source)
}
