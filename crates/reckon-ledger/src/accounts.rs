//! People, memberships, dashboard sessions, sign-in throttling and the token lifecycle.

use crate::LedgerError;
use crate::Result;
use crate::driver::{Driver, RowsAffected, SqlLedger, sql};
use crate::model::{Role, Tenant, TenantId};
use crate::rows;
use crate::scope::Scope;
use macro_rules_attribute::apply;
use reckon_domain::time;
use serde::Serialize;
use sqlx::{FromRow, Row};

/// The sign-in throttle's limits (see [`Accounts::throttle_admit`]).
#[derive(Debug, Clone, Copy)]
pub struct ThrottlePolicy {
    /// Failed attempts one sender (an address, or a known browser) may make for an account
    /// before that sender is locked out of it.
    pub account_free: i64,
    /// Failed attempts an account may have from all senders away from its home addresses
    /// before those senders are locked out of it (many addresses guessing one password).
    /// A known browser and an address the account signed in from are never held by it.
    pub account_wide_free: i64,
    /// The first lock; each further failure doubles it...
    pub lock_secs: f64,
    /// ...up to this.
    pub max_lock_secs: f64,
    /// An account's failures are forgotten after this long without an attempt.
    pub forget_after_secs: f64,
    /// Attempts one client address may have in flight or failed in a window...
    pub address_limit: i64,
    /// ...of this length.
    pub address_window_secs: f64,
}

impl ThrottlePolicy {
    /// How long a sender is locked out of an account after its `failures`-th consecutive
    /// failure (0: not).
    pub fn lock_after(&self, failures: i64) -> f64 {
        self.lock_from(self.account_free, failures)
    }

    /// The same for the account-wide count.
    pub fn wide_lock_after(&self, failures: i64) -> f64 {
        self.lock_from(self.account_wide_free, failures)
    }

    fn lock_from(&self, free: i64, failures: i64) -> f64 {
        if failures < free {
            return 0.0;
        }
        let doublings = (failures - free).min(30) as i32;
        (self.lock_secs * 2f64.powi(doublings)).min(self.max_lock_secs)
    }
}

/// The throttle row of one sender's attempts at one account.
fn pair_key(account: &str, sender: &str) -> String {
    format!("{account}\n{sender}")
}

/// The throttle row of a known browser's attempts at one account.
fn device_key(account: &str, device_hash: &str) -> String {
    format!("{account}\ndevice:{device_hash}")
}

/// Whether a sign-in attempt may be checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Admission {
    /// Checked, and already counted as a failure until [`Accounts::throttle_succeeded`].
    Admitted,
    /// This sender is locked out of the account until this time (epoch seconds).
    AccountLocked(f64),
    /// The client address has used its attempts of the window.
    AddressLimited,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct User {
    pub id: i64,
    pub email: String,
    pub disabled: bool,
    pub created_at: f64,
}

/// What sign-in needs to check a person. `Debug` leaves out the hash and the TOTP secret.
pub struct UserCredentials {
    pub user: User,
    /// argon2id PHC string.
    pub password_hash: String,
    /// The TOTP secret, opened; `None` = no second factor.
    pub totp_secret: Option<secrecy::SecretBox<Vec<u8>>>,
    pub generation: i64,
}

impl std::fmt::Debug for UserCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserCredentials")
            .field("user", &self.user)
            .field("totp", &self.totp_secret.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
pub struct NewSession {
    /// SHA-256 (hex) of the session id; the id itself lives only in the cookie.
    pub id_hash: String,
    pub user_id: i64,
    pub generation: i64,
    pub csrf_token: String,
    pub now: f64,
    pub expires_at: f64,
}

/// A live session: who, in which tenant, with which role now.
#[derive(Debug, Clone)]
pub struct SessionGrant {
    pub tenant: Tenant,
    pub user: User,
    pub role: Role,
    pub csrf_token: String,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct TokenInfo {
    pub id: i64,
    #[sqlx(try_from = "String")]
    pub role: Role,
    pub label: String,
    pub created_by: Option<String>,
    pub created_at: f64,
    pub last_used_at: Option<f64>,
    pub revoked_at: Option<f64>,
}

/// Who makes a token: the operator (CLI, no cap) or a person (capped by their role, and
/// bound to their generation).
#[derive(Debug, Clone, Copy)]
pub enum TokenCreator {
    Operator,
    User { id: i64 },
}

/// The associated data for a user's TOTP secret.
pub(crate) fn totp_aad(user_id: i64) -> String {
    format!("reckon/v1|user:{user_id}|totp_secret")
}

/// `NotFound` (of `what`) when a statement changed no row.
fn found(changed: u64, what: impl FnOnce() -> String) -> Result<()> {
    if changed == 0 {
        return Err(LedgerError::NotFound(what()));
    }
    Ok(())
}

pub(crate) fn normalise_email(email: &str) -> Result<String> {
    let e = email.trim().to_lowercase();
    let ok = e.len() <= 254
        && e.split_once('@')
            .is_some_and(|(l, d)| !l.is_empty() && d.contains('.') && !d.starts_with('.'))
        && !e.chars().any(|c| c.is_whitespace() || c.is_control());
    if ok {
        Ok(e)
    } else {
        Err(LedgerError::Invalid(format!(
            "{email:?} is not an email address"
        )))
    }
}

#[apply(sql!)]
impl<B: Driver> Accounts for SqlLedger<B> {
    async fn create_user(&self, email: &str, password_hash: &str) -> Result<User> {
        let email = normalise_email(email)?;
        let stmt = sqlx::query(
            "INSERT INTO app_user (email, password_hash, created_at) VALUES ($1, $2, $3) \
             RETURNING id, email, disabled_at IS NOT NULL AS disabled, created_at",
        );
        let stmt = stmt.bind(&email).bind(password_hash).bind(time::now());
        let row = self.write_opt(Scope::Global, stmt).await;
        let row = row.map_err(|e| e.named(|| format!("user {email:?}")))?;
        Ok(User::from_row(&row.expect("an INSERT returns its row"))?)
    }

    async fn user_by_email(&self, email: &str) -> Result<Option<UserCredentials>> {
        let Ok(email) = normalise_email(email) else {
            return Ok(None);
        };
        let stmt = sqlx::query(
            "SELECT id, email, password_hash, totp_secret, auth_generation, \
             disabled_at IS NOT NULL AS disabled, created_at FROM app_user WHERE email = $1",
        )
        .bind(&email);
        let row = self.read_opt(Scope::Global, stmt).await?;
        let Some(row) = row else { return Ok(None) };
        let user = User::from_row(&row)?;
        let sealed: Option<Vec<u8>> = row.try_get("totp_secret")?;
        let totp_secret = match sealed {
            None => None,
            Some(s) => Some(secrecy::SecretBox::new(Box::new(
                self.keyring
                    .open(&totp_aad(user.id), &s)
                    .ok_or(LedgerError::Decrypt)?,
            ))),
        };
        Ok(Some(UserCredentials {
            user,
            password_hash: row.try_get("password_hash")?,
            totp_secret,
            generation: row.try_get("auth_generation")?,
        }))
    }

    /// Add or change a person's role in a tenant.
    async fn set_membership(&self, tenant: TenantId, user_id: i64, role: Role) -> Result<()> {
        let stmt = sqlx::query(
            "INSERT INTO membership (user_id, tenant_id, role, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (user_id, tenant_id) DO UPDATE SET role = excluded.role",
        );
        let stmt = stmt.bind(user_id).bind(tenant.0).bind(role.as_str());
        self.exec(Scope::Tenant(tenant), stmt.bind(time::now()))
            .await?;
        Ok(())
    }

    async fn memberships(&self, user_id: i64) -> Result<Vec<(Tenant, Role)>> {
        let stmt = sqlx::query(
            "SELECT t.id, t.slug, t.created_at, m.role FROM membership m \
             JOIN tenant t ON t.id = m.tenant_id WHERE m.user_id = $1 ORDER BY t.slug",
        )
        .bind(user_id);
        let rows = self.read_all(Scope::User(user_id), stmt).await?;
        rows.iter()
            .map(|r| Ok((rows::tenant::<B::DB>(r)?, rows::role::<B::DB>(r)?)))
            .collect()
    }

    /// The people of a tenant with their role there, by email.
    async fn members(&self, tenant: TenantId) -> Result<Vec<(User, Role)>> {
        let stmt = sqlx::query(
            "SELECT u.id, u.email, u.disabled_at IS NOT NULL AS disabled, u.created_at, m.role \
             FROM membership m JOIN app_user u ON u.id = m.user_id WHERE m.tenant_id = $1 \
             ORDER BY u.email",
        )
        .bind(tenant.0);
        let rows = self.read_all(Scope::Tenant(tenant), stmt).await?;
        rows.iter()
            .map(|r| Ok((User::from_row(r)?, rows::role::<B::DB>(r)?)))
            .collect()
    }

    /// New password: every session and token of the user ends, and every sign-in lock of
    /// the account is lifted (the failures were guesses at the old password).
    async fn set_password(&self, user_id: i64, password_hash: &str) -> Result<()> {
        let mut tx = B::begin(self, Scope::Global, true).await?;
        let n = sqlx::query(
            "UPDATE app_user SET password_hash = $1, auth_generation = auth_generation + 1 \
             WHERE id = $2",
        )
        .bind(password_hash)
        .bind(user_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        found(n, || format!("user {user_id}"))?;
        sqlx::query(
            "DELETE FROM auth_throttle WHERE scope IN ('pair', 'device', 'account') \
             AND account = (SELECT email FROM app_user WHERE id = $1)",
        )
        .bind(user_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Lift every sign-in lock of `account` (`reckon user unlock`); how many senders' locks
    /// or counts were cleared.
    async fn unlock_account(&self, account: &str) -> Result<u64> {
        let account = account.trim().to_lowercase();
        let stmt = sqlx::query(
            "DELETE FROM auth_throttle WHERE scope IN ('pair', 'device', 'account') \
             AND account = $1",
        );
        self.exec(Scope::Global, stmt.bind(account)).await
    }

    /// Remember that the browser holding the device id whose hash is `device_hash` signed
    /// in to `account`: its attempts at that account are then counted on their own.
    async fn remember_device(&self, account: &str, device_hash: &str, now: f64) -> Result<()> {
        let stmt = sqlx::query(
            "INSERT INTO known_device (id_hash, account, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (id_hash, account) DO NOTHING",
        );
        self.exec(
            Scope::Global,
            stmt.bind(device_hash).bind(account).bind(now),
        )
        .await?;
        Ok(())
    }

    /// Disabling (or enabling) ends every session and token of the user.
    async fn set_user_disabled(&self, user_id: i64, disabled: bool) -> Result<()> {
        let stmt = sqlx::query(
            "UPDATE app_user SET disabled_at = $1, auth_generation = auth_generation + 1 \
             WHERE id = $2",
        );
        let n = self.exec(
            Scope::Global,
            stmt.bind(disabled.then(time::now)).bind(user_id),
        );
        found(n.await?, || format!("user {user_id}"))
    }

    /// Turn the second factor on (`Some`) or off.
    async fn set_totp_secret(&self, user_id: i64, secret: Option<&[u8]>) -> Result<()> {
        let sealed = secret.map(|s| self.keyring.seal(&totp_aad(user_id), s));
        let stmt = sqlx::query("UPDATE app_user SET totp_secret = $1 WHERE id = $2");
        self.exec(Scope::Global, stmt.bind(sealed).bind(user_id))
            .await?;
        Ok(())
    }

    /// Take TOTP time step `step` for the person: true only when it is later than the last
    /// step taken (one conditional UPDATE, so two replicas cannot both accept one code).
    async fn use_totp_step(&self, user_id: i64, step: i64) -> Result<bool> {
        let stmt = sqlx::query(
            "UPDATE app_user SET totp_last_step = $2 WHERE id = $1 \
             AND (totp_last_step IS NULL OR totp_last_step < $2)",
        );
        Ok(self
            .exec(Scope::Global, stmt.bind(user_id).bind(step))
            .await?
            == 1)
    }

    async fn create_session(&self, tenant: TenantId, new: NewSession) -> Result<()> {
        let stmt = sqlx::query(
            "INSERT INTO web_session (id_hash, tenant_id, user_id, auth_generation, \
             csrf_token, created_at, last_seen_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $6, $7)",
        )
        .bind(&new.id_hash)
        .bind(tenant.0)
        .bind(new.user_id)
        .bind(new.generation)
        .bind(&new.csrf_token)
        .bind(new.now)
        .bind(new.expires_at);
        self.exec(Scope::Tenant(tenant), stmt).await?;
        Ok(())
    }

    /// The live session with this id hash: not expired, its user enabled and of the same
    /// generation, still a member. Moves `last_seen_at` and the inactivity deadline.
    async fn session(
        &self,
        id_hash: &str,
        now: f64,
        idle_secs: f64,
    ) -> Result<Option<SessionGrant>> {
        let mut tx = B::begin(self, Scope::Session(id_hash), true).await?;
        let Some(s) = sqlx::query(
            "SELECT tenant_id, user_id, auth_generation, csrf_token, last_seen_at, \
             expires_at FROM web_session WHERE id_hash = $1",
        )
        .bind(id_hash)
        .fetch_optional(&mut *tx)
        .await?
        else {
            return Ok(None);
        };
        let tenant_id: i64 = s.try_get("tenant_id")?;
        let user_id: i64 = s.try_get("user_id")?;
        let generation: i64 = s.try_get("auth_generation")?;
        let expires_at: f64 = s.try_get("expires_at")?;
        let last_seen: f64 = s.try_get("last_seen_at")?;
        let csrf_token: String = s.try_get("csrf_token")?;
        let tenant = TenantId(tenant_id);
        B::rescope(&mut tx, Scope::Tenant(tenant)).await?;
        let live = sqlx::query(
            "SELECT u.email, u.created_at AS user_created_at, u.auth_generation, \
             u.disabled_at, m.role, t.id, t.slug, t.created_at \
             FROM app_user u JOIN membership m ON m.user_id = u.id AND m.tenant_id = $2 \
             JOIN tenant t ON t.id = m.tenant_id WHERE u.id = $1",
        )
        .bind(user_id)
        .bind(tenant_id)
        .fetch_optional(&mut *tx)
        .await?;
        let grant = match live {
            Some(r)
                if expires_at > now
                    && now - last_seen < idle_secs
                    && r.try_get::<Option<f64>, _>("disabled_at")?.is_none()
                    && r.try_get::<i64, _>("auth_generation")? == generation =>
            {
                Some(SessionGrant {
                    tenant: rows::tenant::<B::DB>(&r)?,
                    user: User {
                        id: user_id,
                        email: r.try_get("email")?,
                        disabled: false,
                        created_at: r.try_get("user_created_at")?,
                    },
                    role: rows::role::<B::DB>(&r)?,
                    csrf_token,
                })
            }
            _ => None,
        };
        if grant.is_some() {
            // At most one write a minute per session, like token last_used_at.
            if now - last_seen > 60.0 {
                sqlx::query("UPDATE web_session SET last_seen_at = $1 WHERE id_hash = $2")
                    .bind(now)
                    .bind(id_hash)
                    .execute(&mut *tx)
                    .await?;
            }
        } else {
            // Dead for good (expired, idle, disabled, new password, no membership).
            sqlx::query("DELETE FROM web_session WHERE id_hash = $1")
                .bind(id_hash)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(grant)
    }

    async fn delete_session(&self, id_hash: &str) -> Result<()> {
        let stmt = sqlx::query("DELETE FROM web_session WHERE id_hash = $1").bind(id_hash);
        self.exec(Scope::Session(id_hash), stmt).await?;
        Ok(())
    }

    /// Admit one sign-in attempt of `account` from `address` (a throttle key: an IPv4
    /// address, or an IPv6 prefix), or refuse it, and count it, in one ledger transaction.
    ///
    /// An admitted attempt counts as a failure from the start, so however many attempts
    /// race, on however many replicas, at most `policy.account_free` of one sender are
    /// admitted before that sender is locked out of the account. The counts:
    /// - a browser holding `device` (the hash of its device id) that signed in to this
    ///   account before is counted on its own: no one else's attempts touch its count, so
    ///   the right person there is never locked out by anyone else;
    /// - otherwise the address, over all accounts, in a window: every attempt counts,
    ///   refused ones too, and an attempt past the limit starts the window again, so a
    ///   sender that keeps trying stays refused;
    /// - the (account, address) pair: consecutive failures, with a lock that grows
    ///   (`policy.lock_after`). An attacker elsewhere locks only their own pair;
    /// - the account, over every address it has never signed in from
    ///   (`policy.account_wide_free`): many addresses guessing one password are held,
    ///   while the account's home addresses and known browsers are not.
    async fn throttle_admit(
        &self,
        account: &str,
        address: &str,
        device: Option<&str>,
        now: f64,
        policy: &ThrottlePolicy,
    ) -> Result<Admission> {
        // One write transaction (SQLite: the write lock from BEGIN; PostgreSQL: the rows'
        // locks, taken by the first UPDATE of each and held to commit, and a concurrent
        // UPDATE re-reads the row it waited for). Each lock is checked and counted by one
        // conditional UPDATE, so two attempts cannot both pass a lock the first one set.
        let mut tx = B::begin(self, Scope::Global, true).await?;
        let known_device = match device {
            Some(d) => {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM known_device WHERE id_hash = $1 AND account = $2",
                )
                .bind(d)
                .bind(account)
                .fetch_one(&mut *tx)
                .await?;
                (n > 0).then_some(d)
            }
            None => None,
        };
        let forget_from = now - policy.forget_after_secs;
        if let Some(d) = known_device {
            let key = device_key(account, d);
            let counted =
                Self::count_failure(&mut tx, "device", &key, account, now, forget_from).await?;
            let Some(failures) = counted else {
                let until = Self::locked_until(&mut tx, "device", &key).await?;
                tx.rollback().await?;
                return Ok(Admission::AccountLocked(until));
            };
            Self::lock(&mut tx, "device", &key, now, policy.lock_after(failures)).await?;
            tx.commit().await?;
            return Ok(Admission::Admitted);
        }
        sqlx::query(
            "INSERT INTO auth_throttle (scope, key, failures, window_start, locked_until) \
             VALUES ('address', $1, 0, $2, 0) ON CONFLICT (scope, key) DO NOTHING",
        )
        .bind(address)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let window_from = now - policy.address_window_secs;
        let by_address: i64 = sqlx::query_scalar(
            "UPDATE auth_throttle SET \
             failures = CASE WHEN window_start > $3 THEN failures + 1 ELSE 1 END, \
             window_start = CASE WHEN window_start > $3 AND failures < $4 THEN window_start \
             ELSE $2 END \
             WHERE scope = 'address' AND key = $1 RETURNING failures",
        )
        .bind(address)
        .bind(now)
        .bind(window_from)
        .bind(policy.address_limit)
        .fetch_one(&mut *tx)
        .await?;
        if by_address > policy.address_limit {
            // Counted: the sender's refused attempts keep it refused.
            tx.commit().await?;
            return Ok(Admission::AddressLimited);
        }
        let pair = pair_key(account, address);
        let Some(failures) =
            Self::count_failure(&mut tx, "pair", &pair, account, now, forget_from).await?
        else {
            let until = Self::locked_until(&mut tx, "pair", &pair).await?;
            tx.commit().await?;
            return Ok(Admission::AccountLocked(until));
        };
        Self::lock(&mut tx, "pair", &pair, now, policy.lock_after(failures)).await?;
        let home: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM auth_throttle WHERE scope = 'home' AND key = $1",
        )
        .bind(&pair)
        .fetch_one(&mut *tx)
        .await?;
        if home == 0 {
            let counted =
                Self::count_failure(&mut tx, "account", account, account, now, forget_from).await?;
            let Some(wide) = counted else {
                let until = Self::locked_until(&mut tx, "account", account).await?;
                // The pair's count stays: a refused attempt counts against its sender.
                tx.commit().await?;
                return Ok(Admission::AccountLocked(until));
            };
            let lock = policy.wide_lock_after(wide);
            Self::lock(&mut tx, "account", account, now, lock).await?;
        }
        tx.commit().await?;
        Ok(Admission::Admitted)
    }

    /// An admitted attempt signed in: the sender's failures and lock are cleared, as is
    /// the account's wide count; the address gets its attempt back and becomes one of the
    /// account's home addresses; a known browser's count is cleared.
    async fn throttle_succeeded(
        &self,
        account: &str,
        address: &str,
        device: Option<&str>,
    ) -> Result<()> {
        let mut tx = B::begin(self, Scope::Global, true).await?;
        let pair = pair_key(account, address);
        let device = device.map(|d| device_key(account, d)).unwrap_or_default();
        sqlx::query(
            "DELETE FROM auth_throttle WHERE (scope = 'account' AND key = $1) \
             OR (scope = 'pair' AND key = $2) OR (scope = 'device' AND key = $3)",
        )
        .bind(account)
        .bind(&pair)
        .bind(&device)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO auth_throttle (scope, key, failures, window_start, locked_until, \
             account) VALUES ('home', $1, 0, 0, 0, $2) ON CONFLICT (scope, key) DO NOTHING",
        )
        .bind(&pair)
        .bind(account)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE auth_throttle SET \
             failures = CASE WHEN failures > 0 THEN failures - 1 ELSE 0 END \
             WHERE scope = 'address' AND key = $1",
        )
        .bind(address)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// A token made by `creator`. A person may not make a token above their own role.
    async fn create_token_by(
        &self,
        tenant: TenantId,
        role: Role,
        token_hash: &str,
        label: &str,
        creator: TokenCreator,
    ) -> Result<i64> {
        let mut tx = B::begin(self, Scope::Tenant(tenant), true).await?;
        let (created_by, generation) = match creator {
            TokenCreator::Operator => (None, None),
            TokenCreator::User { id } => {
                let Some((theirs, generation)) = Self::standing(&mut tx, tenant, id).await? else {
                    return Err(LedgerError::Invalid(
                        "the creator is not an enabled member of this tenant".into(),
                    ));
                };
                if role > theirs {
                    return Err(LedgerError::Invalid(format!(
                        "a token cannot have a higher role ({}) than its creator ({})",
                        role.as_str(),
                        theirs.as_str()
                    )));
                }
                (Some(id), Some(generation))
            }
        };
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO api_token (tenant_id, role, token_hash, label, created_at, \
             created_by, creator_generation) VALUES ($1, $2, $3, $4, $5, $6, $7) \
             RETURNING id",
        )
        .bind(tenant.0)
        .bind(role.as_str())
        .bind(token_hash)
        .bind(label)
        .bind(time::now())
        .bind(created_by)
        .bind(generation)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(id)
    }

    async fn list_tokens(&self, tenant: TenantId) -> Result<Vec<TokenInfo>> {
        let stmt = sqlx::query(
            "SELECT k.id, k.role, k.label, u.email AS created_by, k.created_at, k.last_used_at, \
             k.revoked_at FROM api_token k LEFT JOIN app_user u ON u.id = k.created_by \
             WHERE k.tenant_id = $1 ORDER BY k.id",
        )
        .bind(tenant.0);
        rows::all(&self.read_all(Scope::Tenant(tenant), stmt).await?)
    }

    /// `false` when no live token of this tenant has that id.
    async fn revoke_token(&self, tenant: TenantId, token_id: i64) -> Result<bool> {
        let stmt = sqlx::query(
            "UPDATE api_token SET revoked_at = $1 \
             WHERE tenant_id = $2 AND id = $3 AND revoked_at IS NULL",
        );
        let stmt = stmt.bind(time::now()).bind(tenant.0).bind(token_id);
        Ok(self.exec(Scope::Tenant(tenant), stmt).await? == 1)
    }

    /// An operator's token (no person behind it): `reckon token create`.
    async fn create_token(
        &self,
        tenant: TenantId,
        role: Role,
        token_hash: &str,
        label: &str,
    ) -> Result<i64> {
        let by = TokenCreator::Operator;
        self.create_token_by(tenant, role, token_hash, label, by)
            .await
    }

    /// The tenant and role of a live token with this hash, if any. A person's token acts
    /// with at most their current role, and dies with their generation.
    async fn authenticate_token(&self, token_hash: &str) -> Result<Option<crate::TokenGrant>> {
        let mut tx = B::begin(self, Scope::Token(token_hash), true).await?;
        let Some(row) = sqlx::query(
            "SELECT k.id AS token_id, k.role, k.last_used_at, k.created_by, \
             k.creator_generation, t.id, t.slug, t.created_at \
             FROM api_token k JOIN tenant t ON t.id = k.tenant_id \
             WHERE k.token_hash = $1 AND k.revoked_at IS NULL",
        )
        .bind(token_hash)
        .fetch_optional(&mut *tx)
        .await?
        else {
            return Ok(None);
        };
        let tenant = rows::tenant::<B::DB>(&row)?;
        let token_id: i64 = row.try_get("token_id")?;
        let mut role = rows::role::<B::DB>(&row)?;
        let created_by: Option<i64> = row.try_get("created_by")?;
        let creator_generation: Option<i64> = row.try_get("creator_generation")?;
        let last_used: Option<f64> = row.try_get("last_used_at")?;
        if let Some(user_id) = created_by {
            B::rescope(&mut tx, Scope::Tenant(tenant.id)).await?;
            match Self::standing(&mut tx, tenant.id, user_id).await? {
                Some((theirs, generation)) if Some(generation) == creator_generation => {
                    role = role.min(theirs);
                }
                _ => return Ok(None),
            }
        }
        let now = time::now();
        // Write last_used_at at most once a minute: a busy client must not turn every
        // request into a write.
        if last_used.is_none_or(|t| now - t > 60.0) {
            sqlx::query("UPDATE api_token SET last_used_at = $1 WHERE id = $2")
                .bind(now)
                .bind(token_id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Some(crate::TokenGrant {
            tenant,
            role,
            token_id,
            created_by,
        }))
    }
}

#[apply(sql!)]
impl<B: Driver> SqlLedger<B> {
    /// Count one failure on the lock row (`scope`, `key`) unless it is locked at `now`:
    /// its consecutive failures (forgotten after a quiet `forget_from`), or `None` when
    /// locked (and then nothing is counted on it).
    async fn count_failure(
        tx: &mut <B::DB as sqlx::Database>::Connection,
        scope: &str,
        key: &str,
        account: &str,
        now: f64,
        forget_from: f64,
    ) -> Result<Option<i64>> {
        sqlx::query(
            "INSERT INTO auth_throttle (scope, key, failures, window_start, locked_until, \
             account) VALUES ($1, $2, 0, $3, 0, $4) ON CONFLICT (scope, key) DO NOTHING",
        )
        .bind(scope)
        .bind(key)
        .bind(now)
        .bind(account)
        .execute(&mut *tx)
        .await?;
        // `window_start` of a lock row: its last admitted attempt.
        Ok(sqlx::query_scalar(
            "UPDATE auth_throttle SET \
             failures = CASE WHEN window_start > $4 THEN failures + 1 ELSE 1 END, \
             window_start = $3 \
             WHERE scope = $1 AND key = $2 AND locked_until <= $3 \
             RETURNING failures",
        )
        .bind(scope)
        .bind(key)
        .bind(now)
        .bind(forget_from)
        .fetch_optional(&mut *tx)
        .await?)
    }

    async fn locked_until(
        tx: &mut <B::DB as sqlx::Database>::Connection,
        scope: &str,
        key: &str,
    ) -> Result<f64> {
        Ok(sqlx::query_scalar(
            "SELECT locked_until FROM auth_throttle WHERE scope = $1 AND key = $2",
        )
        .bind(scope)
        .bind(key)
        .fetch_one(&mut *tx)
        .await?)
    }

    /// Lock the row for `secs` from `now` (nothing for 0).
    async fn lock(
        tx: &mut <B::DB as sqlx::Database>::Connection,
        scope: &str,
        key: &str,
        now: f64,
        secs: f64,
    ) -> Result<()> {
        if secs > 0.0 {
            sqlx::query("UPDATE auth_throttle SET locked_until = $3 WHERE scope = $1 AND key = $2")
                .bind(scope)
                .bind(key)
                .bind(now + secs)
                .execute(&mut *tx)
                .await?;
        }
        Ok(())
    }

    /// An enabled member's role in `tenant` and their generation; `None` for anyone else.
    async fn standing(
        tx: &mut <B::DB as sqlx::Database>::Connection,
        tenant: TenantId,
        user_id: i64,
    ) -> Result<Option<(Role, i64)>> {
        let row = sqlx::query(
            "SELECT m.role, u.auth_generation FROM membership m \
             JOIN app_user u ON u.id = m.user_id \
             WHERE m.user_id = $1 AND m.tenant_id = $2 AND u.disabled_at IS NULL",
        );
        let row = row
            .bind(user_id)
            .bind(tenant.0)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some((
            rows::role::<B::DB>(&row)?,
            row.try_get("auth_generation")?,
        )))
    }
}
