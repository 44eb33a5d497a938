//! The HTTP client provider lookups use (T09): the context's [`GetClient`] confined to the
//! context's egress policy, so every connection goes to an address that passed the policy
//! at the moment the connection was made. The check before each step
//! (`EgressPolicy::check_url`) gives the clear refusal; this one closes the gap between
//! that check and reqwest's own resolution (DNS rebinding).

use reckon_providers::{AddressPolicy, GetClient};
use reckon_sources::EgressPolicy;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// An egress policy as the provider client asks it. Weak: the kept client must not keep
/// its policy alive (it is dropped from [`provider_client`]'s list when the policy goes).
struct Confine(Weak<EgressPolicy>);

impl AddressPolicy for Confine {
    fn addresses(
        &self,
        host: String,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<IpAddr>, String>> + Send + 'static>> {
        let policy = self.0.upgrade();
        // The port does not change what is allowed; the resolver wants one.
        Box::pin(async move {
            match policy {
                Some(p) => p
                    .provider_addresses(&host, 443)
                    .await
                    .map_err(|e| e.to_string()),
                None => Err("the egress policy is gone".to_owned()),
            }
        })
    }
}

/// `base` confined to `egress`. Clients are kept per policy (and timeout) for the life of
/// the policy, so a process with one policy has one confined pool, however many contexts
/// it builds.
pub fn provider_client(base: &GetClient, egress: &Arc<EgressPolicy>) -> GetClient {
    type Kept = Vec<(Weak<EgressPolicy>, Duration, GetClient)>;
    static KEPT: OnceLock<Mutex<Kept>> = OnceLock::new();
    let mut kept = KEPT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    kept.retain(|(w, _, _)| w.strong_count() > 0);
    let timeout = base.timeout();
    if let Some((_, _, c)) = kept
        .iter()
        .find(|(w, t, _)| *t == timeout && w.as_ptr() == Arc::as_ptr(egress))
    {
        return c.clone();
    }
    let client = base.confined(Arc::new(Confine(Arc::downgrade(egress))));
    kept.push((Arc::downgrade(egress), timeout, client.clone()));
    client
}
