//! Tenants and API tokens.

use super::*;

// 2. tenants
pub(crate) async fn story_tenants(ledger: Arc<dyn Ledger>) {
    let acme = ledger.create_tenant("acme").await.expect("create acme");
    assert_eq!(acme.slug, "acme");
    let found = ledger.tenant_by_slug("acme").await.unwrap();
    assert_eq!((found.id, found.slug.as_str()), (acme.id, "acme"));
    let beta = ledger.create_tenant("beta").await.unwrap();
    let by_id = ledger.tenant_by_id(beta.id).await.unwrap();
    assert_eq!((by_id.id, by_id.slug.as_str()), (beta.id, "beta"));
    assert_eq!(ledger.tenant_by_id(acme.id).await.unwrap().slug, "acme");
    assert!(
        ledger
            .list_tenants()
            .await
            .unwrap()
            .iter()
            .any(|t| t.id == acme.id)
    );

    match ledger.create_tenant("acme").await {
        Err(LedgerError::Conflict(_)) => {}
        other => panic!("a duplicate slug must be a Conflict, got {other:?}"),
    }

    let longest = "a".repeat(63);
    ledger
        .create_tenant(&longest)
        .await
        .expect("63 characters is allowed");
    for bad in [
        "Acme".to_owned(),
        "ac me".to_owned(),
        String::new(),
        "a".repeat(64),
        "-acme".to_owned(),
        "acme/evil".to_owned(),
    ] {
        match ledger.create_tenant(&bad).await {
            Err(LedgerError::Invalid(_)) => {}
            other => panic!("slug {bad:?} must be Invalid, got {other:?}"),
        }
    }
    assert_eq!(
        ledger.list_tenants().await.unwrap().len(),
        3,
        "refused slugs must create nothing"
    );

    match ledger.tenant_by_slug("nobody").await {
        Err(LedgerError::NotFound(_)) => {}
        other => panic!("an unknown slug must be NotFound, got {other:?}"),
    }
    match ledger.tenant_by_slug("ACME").await {
        Err(LedgerError::NotFound(_)) => {}
        other => panic!("slugs are looked up exactly, got {other:?}"),
    }
}

// 3. tokens
pub(crate) async fn story_tokens(ledger: Arc<dyn Ledger>) {
    let acme = ledger.create_tenant("acme").await.unwrap();
    let globex = ledger.create_tenant("globex").await.unwrap();
    let hash_a = format!("{:032x}{:032x}", rand::random::<u128>(), 1u8);
    let hash_g = format!("{:032x}{:032x}", rand::random::<u128>(), 2u8);
    let id_a = ledger
        .create_token(acme.id, Role::Finance, &hash_a, "finance laptop")
        .await
        .unwrap();
    let id_g = ledger
        .create_token(globex.id, Role::Admin, &hash_g, "ci")
        .await
        .unwrap();
    assert_ne!(id_a, id_g);

    for _ in 0..2 {
        let grant = ledger
            .authenticate_token(&hash_a)
            .await
            .unwrap()
            .expect("a stored hash authenticates (also a second time)");
        assert_eq!(grant.tenant.id, acme.id);
        assert_eq!(grant.tenant.slug, "acme");
        assert_eq!(grant.role, Role::Finance);
        assert_eq!(grant.token_id, id_a);
    }
    let grant = ledger.authenticate_token(&hash_g).await.unwrap().unwrap();
    assert_eq!(
        (grant.tenant.id, grant.role, grant.token_id),
        (globex.id, Role::Admin, id_g)
    );

    assert!(ledger.authenticate_token("f00d").await.unwrap().is_none());
    assert!(ledger.authenticate_token("").await.unwrap().is_none());
    assert!(
        ledger
            .authenticate_token(&hash_a.to_uppercase())
            .await
            .unwrap()
            .is_none(),
        "hashes are compared exactly"
    );
}
