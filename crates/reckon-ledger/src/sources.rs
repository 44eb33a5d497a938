//! Tenants, their API tokens' creation, and sources: the rows every other feature hangs
//! from, written once for both backends. A source's DSN is sealed before it is stored and
//! opened only by [`SqlLedger::src_dsn`].

use crate::accounts::Scope;
use crate::crypto::dsn_aad;
use crate::driver::{Driver, SqlLedger};
use crate::model::{NewSource, Role, Source, SourceChange, Tenant, TenantId};
use crate::rows::{self, check_name};
use crate::{LedgerError, Result};
use reckon_domain::time;
use secrecy::{ExposeSecret, SecretString};
use sqlx::{AssertSqlSafe, ColumnIndex, Database, Decode, Encode, Type};

impl<B: Driver> SqlLedger<B>
where
    for<'c> &'c mut <B::DB as Database>::Connection: sqlx::Executor<'c, Database = B::DB>,
    <B::DB as Database>::Arguments: sqlx::IntoArguments<B::DB>,
    for<'q> i64: Encode<'q, B::DB> + Type<B::DB> + Decode<'q, B::DB>,
    for<'q> f64: Encode<'q, B::DB> + Type<B::DB> + Decode<'q, B::DB>,
    for<'q> bool: Encode<'q, B::DB> + Type<B::DB> + Decode<'q, B::DB>,
    for<'q> String: Encode<'q, B::DB> + Type<B::DB> + Decode<'q, B::DB>,
    for<'q> &'q str: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> Vec<u8>: Encode<'q, B::DB> + Type<B::DB> + Decode<'q, B::DB>,
    for<'q> Option<i64>: Encode<'q, B::DB>,
    for<'q> Option<f64>: Encode<'q, B::DB>,
    for<'q> Option<String>: Encode<'q, B::DB>,
    for<'q> Option<Vec<u8>>: Encode<'q, B::DB>,
    for<'r> &'r str: ColumnIndex<<B::DB as Database>::Row>,
    usize: ColumnIndex<<B::DB as Database>::Row>,
{
    pub(crate) async fn tn_create(&self, slug: &str) -> Result<Tenant> {
        check_name("tenant slug", slug)?;
        let mut tx = B::begin(self, Scope::Global, true).await?;
        let row = sqlx::query(
            "INSERT INTO tenant (slug, created_at) VALUES ($1, $2) \
             RETURNING id, slug, created_at",
        )
        .bind(slug)
        .bind(time::now())
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| match LedgerError::from(e) {
            LedgerError::Conflict(_) => LedgerError::Conflict(format!("tenant {slug:?}")),
            other => other,
        })?;
        tx.commit().await?;
        rows::tenant::<B::DB>(&row)
    }

    pub(crate) async fn tn_by_slug(&self, slug: &str) -> Result<Tenant> {
        let mut tx = B::begin(self, Scope::Global, false).await?;
        let row = sqlx::query("SELECT id, slug, created_at FROM tenant WHERE slug = $1")
            .bind(slug)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| LedgerError::NotFound(format!("tenant {slug:?}")))?;
        tx.commit().await?;
        rows::tenant::<B::DB>(&row)
    }

    pub(crate) async fn tn_by_id(&self, tenant: TenantId) -> Result<Tenant> {
        let mut tx = B::begin(self, Scope::Global, false).await?;
        let row = sqlx::query("SELECT id, slug, created_at FROM tenant WHERE id = $1")
            .bind(tenant.0)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| LedgerError::NotFound(format!("tenant {}", tenant.0)))?;
        tx.commit().await?;
        rows::tenant::<B::DB>(&row)
    }

    pub(crate) async fn tn_list(&self) -> Result<Vec<Tenant>> {
        let mut tx = B::begin(self, Scope::Global, false).await?;
        let found = sqlx::query("SELECT id, slug, created_at FROM tenant ORDER BY slug")
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        found.iter().map(rows::tenant::<B::DB>).collect()
    }

    pub(crate) async fn tk_create(
        &self,
        tenant: TenantId,
        role: Role,
        token_hash: &str,
        label: &str,
    ) -> Result<i64> {
        let mut tx = B::begin(self, Scope::Tenant(tenant), true).await?;
        let id = sqlx::query_scalar(
            "INSERT INTO api_token (tenant_id, role, token_hash, label, created_at) \
             VALUES ($1, $2, $3, $4, $5) RETURNING id",
        )
        .bind(tenant.0)
        .bind(role.as_str())
        .bind(token_hash)
        .bind(label)
        .bind(time::now())
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(id)
    }

    pub(crate) async fn src_add(&self, tenant: TenantId, new: NewSource) -> Result<Source> {
        check_name("source name", &new.name)?;
        let sealed = new.dsn.as_ref().map(|d| {
            self.keyring
                .seal(&dsn_aad(tenant.0, &new.name), d.expose_secret().as_bytes())
        });
        let mut tx = B::begin(self, Scope::Tenant(tenant), true).await?;
        let row = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO source (tenant_id, name, kind, dsn_ciphertext, dsn_display, table_name, \
             scan_interval_secs, abandoned_after_secs, overlap_secs, full_scan_every_secs, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING {}",
            rows::SOURCE_COLUMNS
        )))
        .bind(tenant.0)
        .bind(&new.name)
        .bind(new.kind.as_str())
        .bind(sealed)
        .bind(&new.dsn_display)
        .bind(&new.table_name)
        .bind(new.scan_interval_secs)
        .bind(new.abandoned_after_secs)
        .bind(new.overlap_secs)
        .bind(new.full_scan_every_secs)
        .bind(time::now())
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| match LedgerError::from(e) {
            LedgerError::Conflict(_) => LedgerError::Conflict(format!("source {:?}", new.name)),
            other => other,
        })?;
        tx.commit().await?;
        rows::source::<B::DB>(&row)
    }

    pub(crate) async fn src_list(&self, tenant: TenantId) -> Result<Vec<Source>> {
        let mut tx = B::begin(self, Scope::Tenant(tenant), false).await?;
        let found = sqlx::query(AssertSqlSafe(format!(
            "SELECT {} FROM source WHERE tenant_id = $1 ORDER BY name",
            rows::SOURCE_COLUMNS
        )))
        .bind(tenant.0)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        found.iter().map(rows::source::<B::DB>).collect()
    }

    pub(crate) async fn src_by_name(&self, tenant: TenantId, name: &str) -> Result<Source> {
        let mut tx = B::begin(self, Scope::Tenant(tenant), false).await?;
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {} FROM source WHERE tenant_id = $1 AND name = $2",
            rows::SOURCE_COLUMNS
        )))
        .bind(tenant.0)
        .bind(name)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| LedgerError::NotFound(format!("source {name:?}")))?;
        tx.commit().await?;
        rows::source::<B::DB>(&row)
    }

    pub(crate) async fn src_update(
        &self,
        tenant: TenantId,
        name: &str,
        change: SourceChange,
    ) -> Result<Source> {
        let sealed = change.dsn.as_ref().map(|d| {
            self.keyring
                .seal(&dsn_aad(tenant.0, name), d.expose_secret().as_bytes())
        });
        let mut tx = B::begin(self, Scope::Tenant(tenant), true).await?;
        let row = sqlx::query(AssertSqlSafe(rows::update_source_sql()))
            .bind(tenant.0)
            .bind(name)
            .bind(sealed)
            .bind(&change.dsn_display)
            .bind(&change.table_name)
            .bind(change.scan_interval_secs)
            .bind(change.abandoned_after_secs)
            .bind(change.overlap_secs)
            .bind(change.full_scan_every_secs)
            .bind(change.moves_the_source())
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| LedgerError::NotFound(format!("source {name:?}")))?;
        tx.commit().await?;
        rows::source::<B::DB>(&row)
    }

    pub(crate) async fn src_all_scanned(&self) -> Result<Vec<(Tenant, Source)>> {
        let tenants = self.tn_list().await?;
        let mut out = Vec::new();
        for t in tenants {
            for s in self.src_list(t.id).await? {
                if s.kind.is_scanned() {
                    out.push((t.clone(), s));
                }
            }
        }
        Ok(out)
    }

    pub(crate) async fn src_dsn(&self, tenant: TenantId, source: &Source) -> Result<SecretString> {
        let mut tx = B::begin(self, Scope::Tenant(tenant), false).await?;
        let sealed: Option<Vec<u8>> = sqlx::query_scalar(
            "SELECT dsn_ciphertext FROM source WHERE tenant_id = $1 AND id = $2",
        )
        .bind(tenant.0)
        .bind(source.id)
        .fetch_optional(&mut *tx)
        .await?
        .flatten();
        tx.commit().await?;
        let sealed = sealed.ok_or_else(|| LedgerError::NotFound("source DSN".into()))?;
        let plain = self
            .keyring
            .open(&dsn_aad(tenant.0, &source.name), &sealed)
            .ok_or(LedgerError::Decrypt)?;
        String::from_utf8(plain)
            .map(SecretString::from)
            .map_err(|_| LedgerError::Decrypt)
    }
}
