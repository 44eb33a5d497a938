//! A wrong password for a known email and any password for an unknown one take the same
//! steps before the answer: one throttle step, one lookup, one argon2 verification, and no
//! other ledger call (writing a known person's failure into their tenants' audit logs
//! comes after the answer), and the answers are the same. On both ledgers. The time each
//! takes is measured by `cargo run --release -p reckon-bench --bin signin-timing`.

use crate::common;
use crate::counting;

use common::{Backend, World, sign_in};
use counting::Calls;
use std::time::Duration;

/// The ledger methods a failed sign-in could call before its answer.
const METHODS: [&str; 6] = [
    "throttle_admit",
    "user_by_email",
    "memberships",
    "record_action",
    "use_totp_step",
    "throttle_succeeded",
];

struct Steps {
    status: u16,
    page: String,
    calls: Vec<(&'static str, usize)>,
    verifications: u64,
}

async fn failed_sign_in(w: &World, email: &str) -> Steps {
    let calls: Vec<Calls> = METHODS.iter().map(|m| Calls::of(m)).collect();
    let guards: Vec<_> = calls.iter().map(Calls::install).collect();
    let before = reckon_web::password::verifications();
    let r = sign_in(&w.app, email, "not the password at all", &[]).await;
    // Read before this test task yields: work spawned after the answer has not run yet.
    let verifications = reckon_web::password::verifications() - before;
    let counts = METHODS
        .iter()
        .zip(&calls)
        .map(|(m, c)| (*m, c.count()))
        .collect();
    drop(guards);
    Steps {
        status: r.status.as_u16(),
        page: r.text.replace(email, "EMAIL"),
        calls: counts,
        verifications,
    }
}

/// Wait (bounded) until the failure of a known person is in their tenant's audit log, so
/// that what it writes after the answer is done before the next attempt is counted.
async fn recorded(w: &World, n: usize) {
    for _ in 0..200 {
        let actions = w.ledger.list_actions(w.a.id, None, 50).await.unwrap();
        if actions
            .iter()
            .filter(|a| a.action == "signin_failed")
            .count()
            >= n
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the failed sign-in never reached the audit log");
}

async fn same_steps(backend: Backend) {
    let w = World::new(backend).await;
    // The dummy hash is made on first use; make it before anything is counted.
    let _ = failed_sign_in(&w, "warm-up@nowhere.test").await;
    for round in 1..=3 {
        let known = failed_sign_in(&w, "alice@acme.test").await;
        recorded(&w, round).await;
        let unknown = failed_sign_in(&w, &format!("nobody{round}@acme.test")).await;
        assert_eq!(known.status, 401);
        assert_eq!(known.status, unknown.status);
        assert_eq!(known.page, unknown.page);
        assert_eq!(known.verifications, 1);
        assert_eq!(unknown.verifications, 1);
        assert_eq!(known.calls, unknown.calls, "round {round}");
        let expected: Vec<(&str, usize)> = METHODS
            .iter()
            .map(|m| {
                (
                    *m,
                    usize::from(matches!(*m, "throttle_admit" | "user_by_email")),
                )
            })
            .collect();
        assert_eq!(known.calls, expected);
    }
    w.finish().await;
}

/// One test for both ledgers: the verification count is the process's own.
#[tokio::test]
async fn a_known_and_an_unknown_email_take_the_same_steps_on_both_ledgers() {
    same_steps(Backend::Sqlite).await;
    same_steps(Backend::Postgres).await;
}
