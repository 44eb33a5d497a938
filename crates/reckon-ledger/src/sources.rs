//! Tenants and sources: the rows every other feature hangs from, and a source's scans. A
//! source's DSN is sealed before it is stored and opened only by [`Sources::source_dsn`].

use crate::driver::{Driver, SqlLedger, sql};
use crate::model::{Lease, NewSource, Source, SourceChange, Tenant, TenantId};
use crate::rows::{self, check_name};
use crate::scope::Scope;
use crate::{LedgerError, Result};
use macro_rules_attribute::apply;
use reckon_domain::time;
use reckon_keyring::dsn_aad;
use secrecy::{ExposeSecret, SecretString};
use sqlx::{AssertSqlSafe, Row};

#[apply(sql!)]
impl<B: Driver> Tenants for SqlLedger<B> {
    async fn create_tenant(&self, slug: &str) -> Result<Tenant> {
        check_name("tenant slug", slug)?;
        let stmt = sqlx::query(
            "INSERT INTO tenant (slug, created_at) VALUES ($1, $2) \
             RETURNING id, slug, created_at",
        )
        .bind(slug)
        .bind(time::now());
        let row = self.write_opt(Scope::Global, stmt).await;
        let row = row.map_err(|e| e.named(|| format!("tenant {slug:?}")))?;
        rows::tenant::<B::DB>(&row.expect("an INSERT returns its row"))
    }

    async fn tenant_by_slug(&self, slug: &str) -> Result<Tenant> {
        let stmt =
            sqlx::query("SELECT id, slug, created_at FROM tenant WHERE slug = $1").bind(slug);
        let row = self
            .read_opt(Scope::Global, stmt)
            .await?
            .ok_or_else(|| LedgerError::NotFound(format!("tenant {slug:?}")))?;
        rows::tenant::<B::DB>(&row)
    }

    /// The tenant with this id ([`LedgerError::NotFound`] if there is none).
    async fn tenant_by_id(&self, tenant: TenantId) -> Result<Tenant> {
        let stmt =
            sqlx::query("SELECT id, slug, created_at FROM tenant WHERE id = $1").bind(tenant.0);
        let row = self
            .read_opt(Scope::Global, stmt)
            .await?
            .ok_or_else(|| LedgerError::NotFound(format!("tenant {}", tenant.0)))?;
        rows::tenant::<B::DB>(&row)
    }

    async fn list_tenants(&self) -> Result<Vec<Tenant>> {
        let stmt = sqlx::query("SELECT id, slug, created_at FROM tenant ORDER BY slug");
        let found = self.read_all(Scope::Global, stmt).await?;
        found.iter().map(rows::tenant::<B::DB>).collect()
    }
}

#[apply(sql!)]
impl<B: Driver> Sources for SqlLedger<B> {
    async fn add_source(&self, tenant: TenantId, new: NewSource) -> Result<Source> {
        check_name("source name", &new.name)?;
        let sealed = new.dsn.as_ref().map(|d| {
            self.keyring
                .seal(&dsn_aad(tenant.0, &new.name), d.expose_secret().as_bytes())
        });
        let stmt = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO source (tenant_id, name, kind, dsn_ciphertext, dsn_display, table_name, \
             scan_interval_secs, abandoned_after_secs, overlap_secs, full_scan_every_secs, created_at, \
             mapping) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING {}",
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
        .bind(&new.mapping);
        let row = self.write_opt(Scope::Tenant(tenant), stmt).await;
        let row = row.map_err(|e| e.named(|| format!("source {:?}", new.name)))?;
        rows::source::<B::DB>(&row.expect("an INSERT returns its row"))
    }

    async fn list_sources(&self, tenant: TenantId) -> Result<Vec<Source>> {
        let stmt = sqlx::query(AssertSqlSafe(format!(
            "SELECT {} FROM source WHERE tenant_id = $1 ORDER BY name",
            rows::SOURCE_COLUMNS
        )))
        .bind(tenant.0);
        let found = self.read_all(Scope::Tenant(tenant), stmt).await?;
        found.iter().map(rows::source::<B::DB>).collect()
    }

    async fn source_by_name(&self, tenant: TenantId, name: &str) -> Result<Source> {
        let stmt = sqlx::query(AssertSqlSafe(format!(
            "SELECT {} FROM source WHERE tenant_id = $1 AND name = $2",
            rows::SOURCE_COLUMNS
        )))
        .bind(tenant.0)
        .bind(name);
        let row = self
            .read_opt(Scope::Tenant(tenant), stmt)
            .await?
            .ok_or_else(|| LedgerError::NotFound(format!("source {name:?}")))?;
        rows::source::<B::DB>(&row)
    }

    /// Change a source's settings (`None` keeps a field). A new DSN is sealed like one
    /// added; without one the stored ciphertext is not touched. A new DSN or table drops
    /// the scan cursor. `NotFound` for a name the tenant has no source of.
    async fn update_source(
        &self,
        tenant: TenantId,
        name: &str,
        change: SourceChange,
    ) -> Result<Source> {
        let sealed = change.dsn.as_ref().map(|d| {
            self.keyring
                .seal(&dsn_aad(tenant.0, name), d.expose_secret().as_bytes())
        });
        let stmt = sqlx::query(AssertSqlSafe(rows::update_source_sql()))
            .bind(tenant.0)
            .bind(name)
            .bind(sealed)
            .bind(&change.dsn_display)
            .bind(&change.table_name)
            .bind(change.scan_interval_secs)
            .bind(change.abandoned_after_secs)
            .bind(change.overlap_secs)
            .bind(change.full_scan_every_secs)
            .bind(change.moves_the_source());
        let row = self.write_opt(Scope::Tenant(tenant), stmt).await?;
        rows::source::<B::DB>(
            &row.ok_or_else(|| LedgerError::NotFound(format!("source {name:?}")))?,
        )
    }

    /// Every scanned source of every tenant, for the scheduler (operator scope).
    async fn all_scanned_sources(&self) -> Result<Vec<(Tenant, Source)>> {
        let tenants = self.list_tenants().await?;
        let mut out = Vec::new();
        for t in tenants {
            for s in self.list_sources(t.id).await? {
                if s.kind.is_scanned() {
                    out.push((t.clone(), s));
                }
            }
        }
        Ok(out)
    }

    /// The source's DSN, decrypted.
    async fn source_dsn(&self, tenant: TenantId, source: &Source) -> Result<SecretString> {
        let stmt =
            sqlx::query("SELECT dsn_ciphertext FROM source WHERE tenant_id = $1 AND id = $2")
                .bind(tenant.0)
                .bind(source.id);
        let row = self.read_opt(Scope::Tenant(tenant), stmt).await?;
        let sealed: Option<Vec<u8>> = row.map(|r| r.try_get(0)).transpose()?.flatten();
        let sealed = sealed.ok_or_else(|| LedgerError::NotFound("source DSN".into()))?;
        let plain = self
            .keyring
            .open(&dsn_aad(tenant.0, &source.name), &sealed)
            .ok_or(LedgerError::Decrypt)?;
        String::from_utf8(plain)
            .map(SecretString::from)
            .map_err(|_| LedgerError::Decrypt)
    }

    /// Fenced by `lease` when given: a lost lease writes nothing ([`LedgerError::LeaseLost`]).
    async fn record_scan_success(
        &self,
        tenant: TenantId,
        source_id: i64,
        at: f64,
        full: bool,
        lease: Option<&Lease>,
    ) -> Result<()> {
        let stmt = sqlx::query(
            "UPDATE source SET last_scan_at = $1, last_success_at = $1, consecutive_failures = 0, \
             last_full_scan_at = CASE WHEN $4 THEN $1 ELSE last_full_scan_at END \
             WHERE tenant_id = $2 AND id = $3",
        );
        let stmt = stmt.bind(at).bind(tenant.0).bind(source_id).bind(full);
        self.exec_fenced(Scope::Tenant(tenant), lease, stmt).await
    }

    /// Fenced by `lease` when given, like [`Sources::record_scan_success`].
    async fn record_scan_failure(
        &self,
        tenant: TenantId,
        source_id: i64,
        at: f64,
        error: &str,
        lease: Option<&Lease>,
    ) -> Result<()> {
        let stmt = sqlx::query(
            "UPDATE source SET last_scan_at = $1, last_error = $4, last_error_at = $1, \
             consecutive_failures = consecutive_failures + 1 WHERE tenant_id = $2 AND id = $3",
        );
        let stmt = stmt.bind(at).bind(tenant.0).bind(source_id).bind(error);
        self.exec_fenced(Scope::Tenant(tenant), lease, stmt).await
    }

    /// "Scan now": the scheduler of any replica scans a scanned source whose request is
    /// newer than its last scan's start. `NotFound` for a push source or another tenant's.
    async fn request_scan(&self, tenant: TenantId, name: &str, at: f64) -> Result<Source> {
        // Push sources have nothing to scan.
        let stmt = sqlx::query(AssertSqlSafe(format!(
            "UPDATE source SET scan_requested_at = $3 WHERE tenant_id = $1 AND name = $2 \
             AND kind <> 'push' RETURNING {}",
            rows::SOURCE_COLUMNS
        )));
        let row = self.write_opt(
            Scope::Tenant(tenant),
            stmt.bind(tenant.0).bind(name).bind(at),
        );
        let row = row.await?;
        rows::source::<B::DB>(
            &row.ok_or_else(|| LedgerError::NotFound(format!("scanned source {name:?}")))?,
        )
    }
}
