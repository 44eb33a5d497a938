//! People and memberships.

use super::*;

/// The settings page's people: a tenant's members with their role
/// in it, never another tenant's.
pub(crate) async fn story_dash_members(ledger: Arc<dyn Ledger>) {
    let a = ledger.create_tenant("acme").await.unwrap();
    let b = ledger.create_tenant("globex").await.unwrap();
    let ann = ledger.create_user("ann@acme.test", "x").await.unwrap();
    let bo = ledger.create_user("bo@both.test", "x").await.unwrap();
    let cy = ledger.create_user("cy@globex.test", "x").await.unwrap();
    ledger
        .set_membership(a.id, ann.id, Role::Admin)
        .await
        .unwrap();
    ledger
        .set_membership(a.id, bo.id, Role::Support)
        .await
        .unwrap();
    ledger
        .set_membership(b.id, bo.id, Role::Viewer)
        .await
        .unwrap();
    ledger
        .set_membership(b.id, cy.id, Role::Finance)
        .await
        .unwrap();
    ledger.set_user_disabled(bo.id, true).await.unwrap();
    let got: Vec<(String, Role, bool)> = ledger
        .members(a.id)
        .await
        .unwrap()
        .into_iter()
        .map(|(u, r)| (u.email, r, u.disabled))
        .collect();
    assert_eq!(
        got,
        vec![
            ("ann@acme.test".to_owned(), Role::Admin, false),
            ("bo@both.test".to_owned(), Role::Support, true),
        ]
    );
    let got: Vec<(String, Role)> = ledger
        .members(b.id)
        .await
        .unwrap()
        .into_iter()
        .map(|(u, r)| (u.email, r))
        .collect();
    assert_eq!(
        got,
        vec![
            ("bo@both.test".to_owned(), Role::Viewer),
            ("cy@globex.test".to_owned(), Role::Finance),
        ]
    );
}
