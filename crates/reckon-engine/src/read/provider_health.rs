//! Each provider's health over the last day: how many lookups it answered, how often it
//! could not tell, and its newest error.

use reckon_ledger::{Dashboard, LedgerError, Provider, ProviderHealth, Providers, TenantId};

/// The window provider health covers (the overview's "last 24 h").
pub const HEALTH_SECS: f64 = 86400.0;

/// One provider's health, every provider of the tenant listed (one without lookups too).
#[derive(Debug, Clone)]
pub struct ProviderHealthView {
    pub name: String,
    pub kind: String,
    /// Lookups finished in the window.
    pub lookups: i64,
    /// Of those, the ones that ended `indeterminate` (errors included).
    pub indeterminate: i64,
    /// "12.5 %", or "–" without lookups in the window.
    pub indeterminate_rate: String,
    /// The newest lookup error, of any age, and when.
    pub last_error: Option<String>,
    pub last_error_at: Option<f64>,
}

/// The health of `tenant`'s providers over the day before `now`.
pub async fn provider_health<L: Dashboard + Providers + ?Sized>(
    ledger: &L,
    tenant: TenantId,
    now: f64,
) -> Result<Vec<ProviderHealthView>, LedgerError> {
    let providers = ledger.list_providers(tenant).await?;
    let health = ledger.provider_health(tenant, now - HEALTH_SECS).await?;
    Ok(health_of(&providers, &health))
}

/// Each provider with its health from the window's figures (none: no lookups).
pub fn health_of(providers: &[Provider], health: &[ProviderHealth]) -> Vec<ProviderHealthView> {
    providers
        .iter()
        .map(|p| {
            let h = health.iter().find(|h| h.provider == p.name);
            let (lookups, indeterminate) = h.map_or((0, 0), |h| (h.lookups, h.indeterminate));
            ProviderHealthView {
                name: p.name.clone(),
                kind: p.kind.to_string(),
                lookups,
                indeterminate,
                indeterminate_rate: if lookups == 0 {
                    "–".into()
                } else {
                    format!("{:.1} %", 100.0 * indeterminate as f64 / lookups as f64)
                },
                last_error: h.and_then(|h| h.last_error.clone()),
                last_error_at: h.and_then(|h| h.last_error_at),
            }
        })
        .collect()
}
