//! The audit log of people's actions: append-only, per tenant, read by the tenant's admins.
//! Written by the surfaces (API, dashboard, CLI) where a person acts; the ledger only stores
//! and lists.

use crate::Result;
use crate::driver::{Driver, SqlLedger, row, sql};
use crate::model::TenantId;
use crate::scope::Scope;
use macro_rules_attribute::apply;
use serde::Serialize;
use sqlx::{AssertSqlSafe, Row};

/// One action, as recorded.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Action {
    pub id: i64,
    pub at: f64,
    /// `user:<email>`, `token:<id>`, `operator` (the CLI), or `reckon` (the ledger itself,
    /// when an upgrade changes what is stored).
    pub actor: String,
    /// e.g. `signin`, `signin_failed`, `source.add`, `provider.add`, `route.set`,
    /// `effect.resolve`, `token.create`, `token.revoke`, `export`.
    pub action: String,
    pub target: Option<String>,
    pub detail: serde_json::Value,
    pub address: Option<String>,
}

#[derive(Debug, Clone)]
pub struct NewAction {
    pub actor: String,
    pub action: String,
    pub target: Option<String>,
    /// Never a secret: callers pass names and outcomes, not DSNs or keys.
    pub detail: serde_json::Value,
    pub address: Option<String>,
}

const ACTION_COLUMNS: &str = "id, at, actor, action, target, detail, address";

#[apply(row!)]
fn action<DB: Database>(r: &DB::Row) -> Result<Action> {
    Ok(Action {
        id: r.try_get("id")?,
        at: r.try_get("at")?,
        actor: r.try_get("actor")?,
        action: r.try_get("action")?,
        target: r.try_get("target")?,
        detail: crate::rows::json(r, "detail")?,
        address: r.try_get("address")?,
    })
}

#[apply(sql!)]
impl<B: Driver> ActionLog for SqlLedger<B> {
    /// Append one action to the tenant's audit log (append-only: nothing updates or
    /// deletes it).
    async fn record_action(&self, tenant: TenantId, a: NewAction) -> Result<()> {
        let stmt = sqlx::query(
            "INSERT INTO audit_log (tenant_id, at, actor, action, target, detail, address) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(tenant.0)
        .bind(reckon_domain::time::now())
        .bind(a.actor)
        .bind(a.action)
        .bind(a.target)
        .bind(a.detail.to_string())
        .bind(a.address);
        self.exec(Scope::Tenant(tenant), stmt).await?;
        Ok(())
    }

    /// The tenant's actions, newest first, before `before_id` (a page's last id).
    async fn list_actions(
        &self,
        tenant: TenantId,
        before_id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<Action>> {
        let stmt = sqlx::query(AssertSqlSafe(format!(
            "SELECT {ACTION_COLUMNS} FROM audit_log \
             WHERE tenant_id = $1 AND id < $2 ORDER BY id DESC LIMIT $3"
        )))
        .bind(tenant.0)
        .bind(before_id.unwrap_or(i64::MAX))
        .bind(limit.clamp(1, 1000));
        let rows = self.read_all(Scope::Tenant(tenant), stmt).await?;
        rows.iter().map(action::<B::DB>).collect()
    }

    /// The tenant's actions on one target (`source/key`, a provider's name, `token:N`),
    /// newest first, before `before_id`: who did what to it.
    async fn actions_on(
        &self,
        tenant: TenantId,
        target: &str,
        before_id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<Action>> {
        let stmt = sqlx::query(AssertSqlSafe(format!(
            "SELECT {ACTION_COLUMNS} FROM audit_log \
             WHERE tenant_id = $1 AND target = $2 AND id < $3 ORDER BY id DESC LIMIT $4"
        )))
        .bind(tenant.0)
        .bind(target)
        .bind(before_id.unwrap_or(i64::MAX))
        .bind(limit.clamp(1, 1000));
        let rows = self.read_all(Scope::Tenant(tenant), stmt).await?;
        rows.iter().map(action::<B::DB>).collect()
    }
}
