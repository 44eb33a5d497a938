//! State changes made the same way from every surface: validate, check the egress policy,
//! store, and write the tenant's audit-log line. The CLI, the API and the dashboard differ
//! only in who acts, through which surface, and how they show a refusal; what is checked,
//! stored and logged is decided here once.

use crate::provider_input::{ProviderEdit, ProviderInput, base_url, check_provider, new_provider};
use crate::source_input::{
    SourceEdit, SourceInput, check_dsn_at_save, check_mapping_at_save, new_source, source_change,
};
use reckon_domain::{Outcome, time};
use reckon_ledger::{
    Ledger, LedgerError, NewAction, NewResolution, Provider, ProviderChange, Resolution, Role,
    Route, Source, Tenant, TenantId, TokenCreator, User,
};
use reckon_sources::{EgressPolicy, MappingCheck};
use secrecy::ExposeSecret;
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
    /// What the person asked for is above what they may do (a token of a higher role).
    #[error("{0}")]
    Forbidden(String),
    /// A name the tenant already uses, or a decision already taken.
    #[error("{0}")]
    Exists(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl Ctx<'_> {
    async fn log(&self, action: &str, target: &str, detail: Value) {
        log(
            self.ledger,
            self.tenant.id,
            &self.actor,
            self.via,
            action,
            target,
            detail,
        )
        .await;
    }
}

/// The change is committed before it is logged, so a failed log write is reported loudly
/// rather than turned into an error the caller would read as "not done".
async fn log(
    ledger: &dyn Ledger,
    tenant: TenantId,
    actor: &str,
    via: Via,
    action: &str,
    target: &str,
    mut detail: Value,
) {
    detail["via"] = json!(via.as_str());
    let new = NewAction {
        actor: actor.to_owned(),
        action: action.to_owned(),
        target: Some(target.to_owned()),
        detail,
        address: None,
    };
    if let Err(e) = ledger.record_action(tenant, new).await {
        tracing::error!(error = %e, action, "could not write the audit log");
    }
}

fn parse_role(role: &str) -> Result<Role, CommandError> {
    Role::try_from(role.to_owned()).map_err(|e| CommandError::Invalid(e.to_string()))
}

/// Add a source (`source.add`).
pub async fn add_source(c: &Ctx<'_>, input: SourceInput) -> Result<Source, CommandError> {
    add_source_checked(c, input).await.map(|(s, _)| s)
}

/// Add a source (`source.add`), with what its mapping's conditions match in the live table
/// when it is read through one: a mapping is held against the table before anything is
/// stored, and refused with the sentence that names the field and the column.
pub async fn add_source_checked(
    c: &Ctx<'_>,
    input: SourceInput,
) -> Result<(Source, Option<MappingCheck>), CommandError> {
    let name = input.name.clone();
    let new = new_source(input).map_err(CommandError::Invalid)?;
    check_dsn_at_save(new.kind, new.dsn.as_ref(), c.egress, &c.tenant.slug)
        .await
        .map_err(CommandError::Invalid)?;
    let checked = match &new.mapping {
        None => None,
        Some(settings) => Some(
            check_mapping_at_save(
                new.kind,
                new.dsn.as_ref(),
                settings,
                c.egress,
                &c.tenant.slug,
            )
            .await
            .map_err(CommandError::Invalid)?,
        ),
    };
    let source = c
        .ledger
        .add_source(c.tenant.id, new)
        .await
        .map_err(|e| match e {
            LedgerError::Conflict(_) => {
                CommandError::Exists(format!("a source named {name:?} already exists"))
            }
            other => other.into(),
        })?;
    // The log says "mapped" only of a source read through a mapping: the entries of every
    // other source read as they always have.
    let mut detail = json!({ "kind": source.kind.as_str() });
    if source.mapping.is_some() {
        detail["mapped"] = json!(true);
    }
    c.log("source.add", &source.name, detail).await;
    Ok((source, checked))
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

/// Add a provider (`provider.add`).
pub async fn add_provider(c: &Ctx<'_>, input: ProviderInput) -> Result<Provider, CommandError> {
    let name = input.name.clone();
    let new = new_provider(input, c.egress)
        .await
        .map_err(|e| CommandError::Invalid(e.to_string()))?;
    let provider = c
        .ledger
        .add_provider(c.tenant.id, new)
        .await
        .map_err(|e| match e {
            LedgerError::Conflict(_) => {
                CommandError::Exists(format!("a provider named {name:?} already exists"))
            }
            other => other.into(),
        })?;
    c.log(
        "provider.add",
        &provider.name,
        json!({
            "kind": provider.kind,
            "has_secret": provider.has_secret,
            "override_reason": provider.settings.get("override_reason"),
        }),
    )
    .await;
    Ok(provider)
}

/// Change a provider's secret or settings (`provider.edit`). The stored secret is only sent
/// where it was sent before: a new base_url needs the secret given again.
pub async fn edit_provider(
    c: &Ctx<'_>,
    name: &str,
    edit: ProviderEdit,
) -> Result<Provider, CommandError> {
    let provider = c.ledger.provider_by_name(c.tenant.id, name).await?;
    if edit.secret.is_none() && edit.settings.is_none() {
        return Err(CommandError::Invalid(
            "nothing to change: give secret and/or settings".into(),
        ));
    }
    let settings = edit.settings.as_ref().unwrap_or(&provider.settings);
    // Whoever may edit the provider could otherwise have the stored secret sent to a server
    // of theirs.
    if edit.secret.is_none()
        && provider.has_secret
        && base_url(settings) != base_url(&provider.settings)
    {
        return Err(CommandError::Invalid(
            "the base_url changed: give the secret again (secret), the stored one is only \
             sent where it was sent before"
                .into(),
        ));
    }
    let has_secret = edit.secret.is_some() || provider.has_secret;
    check_provider(
        provider.kind,
        settings,
        edit.secret.as_ref().map(ExposeSecret::expose_secret),
        has_secret,
        c.egress,
    )
    .await
    .map_err(|e| {
        let why = e.to_string();
        match &edit.secret {
            Some(s) if !s.expose_secret().is_empty() => {
                CommandError::Invalid(why.replace(s.expose_secret(), "<redacted>"))
            }
            _ => CommandError::Invalid(why),
        }
    })?;
    let fields: Vec<&str> = [
        edit.secret.is_some().then_some("secret"),
        edit.settings.is_some().then_some("settings"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let change = ProviderChange {
        secret: edit.secret,
        settings: edit.settings,
    };
    let provider = c.ledger.update_provider(c.tenant.id, name, change).await?;
    c.log(
        "provider.edit",
        &provider.name,
        json!({ "fields": fields, "has_secret": provider.has_secret }),
    )
    .await;
    Ok(provider)
}

/// Set (or replace) the route of one operation pattern of a source (`route.set`); `None`:
/// no provider answers for it.
pub async fn set_route(
    c: &Ctx<'_>,
    source: &str,
    operation: &str,
    provider: Option<&str>,
) -> Result<Route, CommandError> {
    let (source, operation) = (source.trim(), operation.trim());
    if source.is_empty() || operation.is_empty() {
        return Err(CommandError::Invalid(
            "a route needs a source and an operation (or * for all)".into(),
        ));
    }
    let route = c
        .ledger
        .set_route(c.tenant.id, source, operation, provider)
        .await?;
    if route.provider_id.is_some() {
        // Effects put off for want of a route are looked up at the reconciler's next
        // pass, not after the "no provider" re-check.
        c.ledger
            .due_unrouted(
                c.tenant.id,
                &route.source,
                &route.operation,
                reckon_domain::time::now(),
            )
            .await?;
    }
    c.log(
        "route.set",
        &format!("{}/{}", route.source, route.operation),
        json!({ "provider": route.provider }),
    )
    .await;
    Ok(route)
}

/// A token to make: its role, its label, who makes it, and the highest role they may give.
pub struct TokenRequest<'a> {
    pub role: &'a str,
    pub label: &'a str,
    pub creator: TokenCreator,
    /// `None`: the operator, who may give any role.
    pub ceiling: Option<Role>,
    /// The stored hash of the minted token (the token itself never reaches the ledger).
    pub hash: &'a str,
}

/// Make an API token (`token.create`). Returns its id and role.
pub async fn create_token(c: &Ctx<'_>, t: TokenRequest<'_>) -> Result<(i64, Role), CommandError> {
    let role = parse_role(t.role)?;
    if let Some(max) = t.ceiling
        && role > max
    {
        return Err(CommandError::Forbidden(format!(
            "a token cannot have a higher role ({}) than its maker's ({})",
            role.as_str(),
            max.as_str()
        )));
    }
    let label = t.label.trim();
    // Characters, not bytes: the limit the API document states (JSON Schema's maxLength).
    if label.is_empty() || label.chars().count() > 100 || label.chars().any(char::is_control) {
        return Err(CommandError::Invalid(
            "the label must be 1-100 printable characters".into(),
        ));
    }
    let id = c
        .ledger
        .create_token_by(c.tenant.id, role, t.hash, label, t.creator)
        .await?;
    c.log(
        "token.create",
        &format!("token:{id}"),
        json!({ "role": role, "label": label }),
    )
    .await;
    Ok((id, role))
}

/// Revoke a token (`token.revoke`). Another tenant's token and one already revoked are the
/// same `NotFound`.
pub async fn revoke_token(c: &Ctx<'_>, id: i64) -> Result<(), CommandError> {
    if !c.ledger.revoke_token(c.tenant.id, id).await? {
        return Err(LedgerError::NotFound(format!("no live token {id} in this tenant")).into());
    }
    c.log("token.revoke", &format!("token:{id}"), json!({}))
        .await;
    Ok(())
}

/// The longest note a resolution by hand keeps.
pub const MAX_NOTE: usize = 4000;

/// A person's conclusion about one unresolved effect.
pub struct Decision<'a> {
    pub source: &'a str,
    pub key: &'a str,
    pub outcome: &'a str,
    pub note: &'a str,
    /// The resolution's author, as its timeline shows them.
    pub author: String,
}

/// Resolve an unresolved effect by hand (`effect.resolve`): an outcome a person can know
/// (applied, not applied, a duplicate), a note saying how, and the evidence they decided on
/// (the effect and its last lookup, frozen with the decision).
pub async fn resolve(c: &Ctx<'_>, d: Decision<'_>) -> Result<Resolution, CommandError> {
    let Some(outcome @ (Outcome::Applied | Outcome::NotApplied | Outcome::Duplicate)) =
        Outcome::parse(d.outcome)
    else {
        return Err(CommandError::Invalid(format!(
            "outcome {:?}: a person resolves with applied, not_applied or duplicate",
            d.outcome
        )));
    };
    let note = d.note.trim();
    if note.is_empty() {
        return Err(CommandError::Invalid(
            "a note is required: say how you know (ticket, provider dashboard, conversation)"
                .into(),
        ));
    }
    if note.chars().count() > MAX_NOTE {
        return Err(CommandError::Invalid(format!(
            "the note is longer than {MAX_NOTE} characters"
        )));
    }
    let effect = c
        .ledger
        .get_effect(c.tenant.id, d.source, d.key)
        .await?
        .map(|f| f.effect)
        .ok_or_else(|| {
            LedgerError::NotFound(format!("no effect with that key in source {:?}", d.source))
        })?;
    if effect.unresolved_kind.is_none() {
        return Err(CommandError::Exists(
            "the effect is not unresolved: there is nothing to decide".into(),
        ));
    }
    let view = c.ledger.reconcile_view(c.tenant.id, effect.id).await?;
    let evidence = json!({
        "seen_by": c.via.as_str(),
        "frozen_at": time::now(),
        "effect": {
            "state": effect.state,
            "updated_at": effect.updated_at,
            "attempts": effect.attempts,
            "response": effect.response_json,
        },
        "reconcile_state": view.state,
        "last_attempt": view.attempts.last(),
    });
    let new = NewResolution {
        outcome,
        author: d.author,
        note: Some(note.to_owned()),
        evidence,
    };
    let resolution = c
        .ledger
        .resolve_by_hand(c.tenant.id, effect.id, new)
        .await
        .map_err(|e| match e {
            LedgerError::Conflict(_) => {
                CommandError::Exists("the effect is already resolved".into())
            }
            other => other.into(),
        })?;
    c.log(
        "effect.resolve",
        &format!("{}/{}", d.source, d.key),
        json!({ "outcome": resolution.outcome, "note": resolution.note }),
    )
    .await;
    Ok(resolution)
}

/// Every indeterminate effect of one provider created in `[from, to]` is due again now
/// (`reconcile.requeue`). Returns how many.
pub async fn requeue(
    c: &Ctx<'_>,
    provider: &str,
    from: f64,
    to: f64,
) -> Result<(Provider, u64), CommandError> {
    if !(from.is_finite() && to.is_finite() && from <= to) {
        return Err(CommandError::Invalid(
            "from and to must be epoch seconds with from <= to".into(),
        ));
    }
    let provider = c.ledger.provider_by_name(c.tenant.id, provider).await?;
    let n = c
        .ledger
        .requeue_indeterminate(c.tenant.id, provider.id, from, to, time::now())
        .await?;
    c.log(
        "reconcile.requeue",
        &provider.name,
        json!({ "from": from, "to": to, "requeued": n }),
    )
    .await;
    Ok((provider, n))
}

/// A person's role in the tenant, as one surface may set it.
pub struct Member<'a> {
    pub email: &'a str,
    pub role: &'a str,
    /// `Some`: a tenant's admin, who changes only the roles of the tenant's members, never
    /// their own (no lock-out by a slip of the hand). `None`: the operator, who may give a
    /// role to any account.
    pub acting_user: Option<i64>,
    /// For the operator: the password hash to make the account with when the email has
    /// none (`user.create`). Without it, an email with no account is refused.
    pub new_account: Option<&'a str>,
}

/// Give a person a role in the tenant (`member.set`), making their account first if the
/// operator asked for it. Returns the person, their role, and whether the account is new.
///
/// A tenant's admin gets the same refusal for a non-member as for a non-account: telling
/// them apart would tell one tenant's admin who has an account in another tenant.
pub async fn set_member(c: &Ctx<'_>, m: Member<'_>) -> Result<(User, Role, bool), CommandError> {
    let role = parse_role(m.role)?;
    let email = m.email.trim().to_lowercase();
    let (person, created) = match m.acting_user {
        Some(acting) => {
            let members = c.ledger.members(c.tenant.id).await?;
            let Some((person, _)) = members.into_iter().find(|(u, _)| u.email == email) else {
                return Err(CommandError::Invalid(
                    "no member of this tenant has this email: people are added with \
                     `reckon user create --tenant`"
                        .into(),
                ));
            };
            if person.id == acting {
                return Err(CommandError::Forbidden(
                    "you cannot change your own role".into(),
                ));
            }
            (person, false)
        }
        None => match (c.ledger.user_by_email(&email).await?, m.new_account) {
            (Some(found), _) => (found.user, false),
            (None, Some(hash)) => {
                let user = c
                    .ledger
                    .create_user(&email, hash)
                    .await
                    .map_err(|e| match e {
                        LedgerError::Conflict(_) => {
                            CommandError::Exists(format!("user {email:?} already exists"))
                        }
                        LedgerError::Invalid(m) => CommandError::Invalid(m),
                        other => other.into(),
                    })?;
                c.log("user.create", &format!("user:{}", user.email), json!({}))
                    .await;
                (user, true)
            }
            (None, None) => {
                return Err(LedgerError::NotFound(format!("no user {email:?}")).into());
            }
        },
    };
    c.ledger
        .set_membership(c.tenant.id, person.id, role)
        .await?;
    c.log(
        "member.set",
        &format!("user:{}", person.email),
        json!({ "role": role }),
    )
    .await;
    Ok((person, role, created))
}

/// A change to a person's account, which every tenant they belong to sees.
pub enum AccountChange<'a> {
    /// A new password hash: the person's sessions and tokens end.
    Password(&'a str),
    /// Disabled (`true`): sessions and tokens end now; `false` lets them sign in again.
    Disabled(bool),
    /// A sealed-at-rest TOTP secret to turn the second factor on, or `None` to turn it off.
    SecondFactor(Option<&'a [u8]>),
}

/// Change a person's account (`user.password`, `user.disable`, `user.enable`,
/// `user.second_factor`). An account belongs to no one tenant, so the line is written in
/// the audit log of every tenant the person is a member of: each tenant's admin sees what
/// happened to their member. Returns the person.
pub async fn change_account(
    ledger: &dyn Ledger,
    actor: &str,
    via: Via,
    email: &str,
    change: AccountChange<'_>,
) -> Result<User, CommandError> {
    let person = ledger
        .user_by_email(email)
        .await?
        .ok_or_else(|| LedgerError::NotFound(format!("no user {email:?}")))?
        .user;
    let (action, detail) = match change {
        AccountChange::Password(hash) => {
            ledger.set_password(person.id, hash).await?;
            ("user.password", json!({}))
        }
        AccountChange::Disabled(true) => {
            ledger.set_user_disabled(person.id, true).await?;
            ("user.disable", json!({}))
        }
        AccountChange::Disabled(false) => {
            ledger.set_user_disabled(person.id, false).await?;
            ("user.enable", json!({}))
        }
        AccountChange::SecondFactor(secret) => {
            ledger.set_totp_secret(person.id, secret).await?;
            ("user.second_factor", json!({ "on": secret.is_some() }))
        }
    };
    let target = format!("user:{}", person.email);
    for (tenant, _) in ledger.memberships(person.id).await? {
        log(
            ledger,
            tenant.id,
            actor,
            via,
            action,
            &target,
            detail.clone(),
        )
        .await;
    }
    Ok(person)
}
