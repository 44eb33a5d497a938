//! Provider accounts (their secrets sealed like a source's DSN) and the routes that say
//! which provider answers for which operation of a source.

use crate::driver::{Driver, SqlLedger, row, sql};
use crate::model::TenantId;
use crate::rows::{self, check_name};
use crate::scope::Scope;
use crate::{LedgerError, Result};
use macro_rules_attribute::apply;
use reckon_domain::{ProviderKind, time};
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;
use sqlx::{AssertSqlSafe, Row};

/// A provider account. The secret (API key or auth header) is never part of this type.
#[derive(Debug, Clone, Serialize)]
pub struct Provider {
    pub id: i64,
    pub name: String,
    pub kind: ProviderKind,
    /// Non-secret settings (base_url, account, mode, metadata_field, ...), as JSON.
    pub settings: serde_json::Value,
    pub has_secret: bool,
    pub created_at: f64,
    /// The reconciler's last calibration of this provider's lookup against the tenant's
    /// known outcomes, for its current settings (`reckon_providers::Calibration` as JSON);
    /// `None` until measured, and again after a change of settings.
    pub calibration: Option<serde_json::Value>,
}

/// A new provider. The secret arrives in clear and leaves only sealed.
#[derive(Debug)]
pub struct NewProvider {
    pub name: String,
    pub kind: ProviderKind,
    pub secret: Option<secrecy::SecretString>,
    pub settings: serde_json::Value,
}

/// An edit of a provider: `None` keeps the stored value. The secret is replaced only
/// when a new one is given; the name and the kind never change.
#[derive(Debug, Default)]
pub struct ProviderChange {
    pub secret: Option<secrecy::SecretString>,
    pub settings: Option<serde_json::Value>,
}

/// Operation pattern of one source -> provider (or none).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Route {
    pub id: i64,
    pub source: String,
    /// An operation name, or `*` for every operation of the source.
    pub operation: String,
    /// `None`: no provider can answer for this operation.
    pub provider: Option<String>,
    #[serde(skip)]
    pub provider_id: Option<i64>,
    #[serde(skip)]
    pub source_id: i64,
}

pub(crate) fn provider_secret_aad(tenant_id: i64, provider_name: &str) -> String {
    format!("reckon/v1|tenant:{tenant_id}|provider:{provider_name}|secret")
}

pub(crate) const PROVIDER_COLUMNS: &str = "id, name, kind, settings, secret_ciphertext IS NOT NULL AS has_secret, created_at, \
     calibration";

#[apply(row!)]
pub(crate) fn provider_row<DB: Database>(row: &DB::Row) -> Result<Provider> {
    Ok(Provider {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        kind: {
            let kind: String = row.try_get("kind")?;
            ProviderKind::parse(&kind).map_err(|e| LedgerError::Invalid(format!("stored {e}")))?
        },
        settings: rows::json(row, "settings")?,
        has_secret: row.try_get("has_secret")?,
        created_at: row.try_get("created_at")?,
        calibration: row
            .try_get::<Option<String>, _>("calibration")?
            .map(|text| {
                serde_json::from_str(&text).map_err(|e| {
                    LedgerError::Invalid(format!("stored calibration is not JSON: {e}"))
                })
            })
            .transpose()?,
    })
}

/// An operation pattern is an operation name or `*`.
pub(crate) fn check_pattern(p: &str) -> Result<()> {
    if p == "*" {
        return Ok(());
    }
    crate::rows::check_name("operation pattern", p)
}

#[apply(sql!)]
impl<B: Driver> Providers for SqlLedger<B> {
    async fn add_provider(&self, tenant: TenantId, new: NewProvider) -> Result<Provider> {
        check_name("provider name", &new.name)?;
        let sealed = new.secret.as_ref().map(|s| {
            self.keyring.seal(
                &provider_secret_aad(tenant.0, &new.name),
                s.expose_secret().as_bytes(),
            )
        });
        let stmt = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO provider (tenant_id, name, kind, secret_ciphertext, settings, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6) RETURNING {PROVIDER_COLUMNS}"
        )))
        .bind(tenant.0)
        .bind(&new.name)
        .bind(new.kind.as_str())
        .bind(sealed)
        .bind(new.settings.to_string())
        .bind(time::now());
        let row = self.write_opt(Scope::Tenant(tenant), stmt).await;
        let row = row.map_err(|e| e.named(|| format!("provider {:?}", new.name)))?;
        provider_row::<B::DB>(&row.expect("an INSERT returns its row"))
    }

    /// Change a provider's settings and/or secret (`None` keeps it; the stored secret is
    /// replaced only by a new one). `NotFound` for a name the tenant has no provider of.
    async fn update_provider(
        &self,
        tenant: TenantId,
        name: &str,
        change: ProviderChange,
    ) -> Result<Provider> {
        let sealed = change.secret.as_ref().map(|s| {
            self.keyring.seal(
                &provider_secret_aad(tenant.0, name),
                s.expose_secret().as_bytes(),
            )
        });
        let settings = change.settings.as_ref().map(ToString::to_string);
        let stmt = sqlx::query(AssertSqlSafe(format!(
            "UPDATE provider SET secret_ciphertext = COALESCE($3, secret_ciphertext), \
             calibration = CASE WHEN $4 IS NULL OR $4 = settings THEN calibration END, \
             settings = COALESCE($4, settings) WHERE tenant_id = $1 AND name = $2 \
             RETURNING {PROVIDER_COLUMNS}"
        )));
        let stmt = stmt.bind(tenant.0).bind(name).bind(sealed).bind(settings);
        let row = self.write_opt(Scope::Tenant(tenant), stmt).await?;
        provider_row::<B::DB>(
            &row.ok_or_else(|| LedgerError::NotFound(format!("provider {name:?}")))?,
        )
    }

    /// Keep a provider's calibration, measured for `settings`: written only while the
    /// provider still has those settings (a calibration of settings changed meanwhile says
    /// nothing of the new ones). Whether it was written.
    async fn record_calibration(
        &self,
        tenant: TenantId,
        provider_id: i64,
        settings: &serde_json::Value,
        calibration: &serde_json::Value,
    ) -> Result<bool> {
        let stmt = sqlx::query(
            "UPDATE provider SET calibration = $4 WHERE tenant_id = $1 AND id = $2 \
             AND settings = $3",
        )
        .bind(tenant.0)
        .bind(provider_id)
        .bind(settings.to_string())
        .bind(calibration.to_string());
        Ok(self.exec(Scope::Tenant(tenant), stmt).await? == 1)
    }

    async fn list_providers(&self, tenant: TenantId) -> Result<Vec<Provider>> {
        let stmt = sqlx::query(AssertSqlSafe(format!(
            "SELECT {PROVIDER_COLUMNS} FROM provider WHERE tenant_id = $1 ORDER BY name"
        )))
        .bind(tenant.0);
        let rows = self.read_all(Scope::Tenant(tenant), stmt).await?;
        rows.iter().map(provider_row::<B::DB>).collect()
    }

    async fn provider_by_name(&self, tenant: TenantId, name: &str) -> Result<Provider> {
        self.provider_where(tenant, Some(name), None).await
    }

    async fn provider_by_id(&self, tenant: TenantId, id: i64) -> Result<Provider> {
        self.provider_where(tenant, None, Some(id)).await
    }

    /// The provider's secret, decrypted (`None` when it has none).
    async fn provider_secret(
        &self,
        tenant: TenantId,
        provider: &Provider,
    ) -> Result<Option<SecretString>> {
        let stmt =
            sqlx::query("SELECT secret_ciphertext FROM provider WHERE tenant_id = $1 AND id = $2");
        let stmt = stmt.bind(tenant.0).bind(provider.id);
        let row = self.read_opt(Scope::Tenant(tenant), stmt).await?;
        let row =
            row.ok_or_else(|| LedgerError::NotFound(format!("provider {:?}", provider.name)))?;
        let Some(sealed) = row.try_get::<Option<Vec<u8>>, _>(0)? else {
            return Ok(None);
        };
        let clear = self
            .keyring
            .open(&provider_secret_aad(tenant.0, &provider.name), &sealed)
            .ok_or(LedgerError::Decrypt)?;
        let text = String::from_utf8(clear).map_err(|_| LedgerError::Decrypt)?;
        Ok(Some(SecretString::from(text)))
    }

    /// Route an operation pattern (a name or `*`) of a source to a provider, or to none.
    /// Setting a route again replaces it.
    async fn set_route(
        &self,
        tenant: TenantId,
        source: &str,
        operation: &str,
        provider: Option<&str>,
    ) -> Result<Route> {
        check_pattern(operation)?;
        let provider_id = match provider {
            Some(p) => Some(self.provider_where(tenant, Some(p), None).await?.id),
            None => None,
        };
        let mut tx = B::begin(self, Scope::Tenant(tenant), true).await?;
        let source_id: i64 =
            sqlx::query_scalar("SELECT id FROM source WHERE tenant_id = $1 AND name = $2")
                .bind(tenant.0)
                .bind(source)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or_else(|| LedgerError::NotFound(format!("source {source:?}")))?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO provider_route (tenant_id, source_id, operation, provider_id, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id, source_id, operation) \
             DO UPDATE SET provider_id = excluded.provider_id, created_at = excluded.created_at \
             RETURNING id",
        )
        .bind(tenant.0)
        .bind(source_id)
        .bind(operation)
        .bind(provider_id)
        .bind(time::now())
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Route {
            id,
            source: source.to_owned(),
            operation: operation.to_owned(),
            provider: provider.map(str::to_owned),
            provider_id,
            source_id,
        })
    }

    async fn list_routes(&self, tenant: TenantId) -> Result<Vec<Route>> {
        let stmt = sqlx::query(
            "SELECT r.id, s.name AS source, r.operation, p.name AS provider, \
             r.provider_id, r.source_id FROM provider_route r \
             JOIN source s ON s.id = r.source_id LEFT JOIN provider p ON p.id = r.provider_id \
             WHERE r.tenant_id = $1 ORDER BY s.name, r.operation",
        )
        .bind(tenant.0);
        rows::all(&self.read_all(Scope::Tenant(tenant), stmt).await?)
    }
}

#[apply(sql!)]
impl<B: Driver> SqlLedger<B> {
    async fn provider_where(
        &self,
        tenant: TenantId,
        name: Option<&str>,
        id: Option<i64>,
    ) -> Result<Provider> {
        let stmt = sqlx::query(AssertSqlSafe(format!(
            "SELECT {PROVIDER_COLUMNS} FROM provider WHERE tenant_id = $1 \
             AND (name = $2 OR id = $3)"
        )))
        .bind(tenant.0)
        .bind(name)
        .bind(id);
        let row = self
            .read_opt(Scope::Tenant(tenant), stmt)
            .await?
            .ok_or_else(|| match name {
                Some(n) => LedgerError::NotFound(format!("provider {n:?}")),
                None => LedgerError::NotFound(format!("provider #{}", id.unwrap_or_default())),
            })?;
        provider_row::<B::DB>(&row)
    }
}
