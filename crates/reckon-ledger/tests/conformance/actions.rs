//! The audit log of people's actions: read whole or about one target, in its tenant only.

use super::*;
use reckon_ledger::NewAction;

fn action(actor: &str, action: &str, target: &str) -> NewAction {
    NewAction {
        actor: actor.into(),
        action: action.into(),
        target: Some(target.into()),
        detail: serde_json::json!({ "via": "api" }),
        address: None,
    }
}

pub(crate) async fn story_actions_on(ledger: Arc<dyn Ledger>) {
    let a = ledger.create_tenant("acme").await.unwrap();
    let b = ledger.create_tenant("globex").await.unwrap();
    for (actor, act, target) in [
        ("user:1", "effect.resolve", "shop/charge:v1:ORD-1"),
        ("token:2", "provider.edit", "stripe"),
        ("operator", "reconcile.requeue", "stripe"),
        ("user:1", "effect.resolve", "shop/charge:v1:ORD-10"),
    ] {
        ledger
            .record_action(a.id, action(actor, act, target))
            .await
            .unwrap();
    }
    ledger
        .record_action(b.id, action("user:9", "provider.add", "stripe"))
        .await
        .unwrap();

    let on = ledger.actions_on(a.id, "stripe", None, 10).await.unwrap();
    let seen: Vec<_> = on
        .iter()
        .map(|x| (x.actor.as_str(), x.action.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("operator", "reconcile.requeue"),
            ("token:2", "provider.edit")
        ],
        "the target's lines, newest first, none of another tenant's"
    );
    assert_eq!(on[0].detail, serde_json::json!({ "via": "api" }));

    let exact = ledger
        .actions_on(a.id, "shop/charge:v1:ORD-1", None, 10)
        .await
        .unwrap();
    assert_eq!(
        exact.len(),
        1,
        "the whole target, never a prefix: {exact:?}"
    );

    let first = ledger.actions_on(a.id, "stripe", None, 1).await.unwrap();
    let next = ledger
        .actions_on(a.id, "stripe", Some(first[0].id), 10)
        .await
        .unwrap();
    assert_eq!(
        next.iter().map(|x| x.id).collect::<Vec<_>>(),
        [on[1].id],
        "pages follow the id, as the whole log's do"
    );
    let theirs = ledger.actions_on(b.id, "stripe", None, 10).await.unwrap();
    assert_eq!(theirs.len(), 1);
    assert_eq!(theirs[0].actor, "user:9");
}
