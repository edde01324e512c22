#![cfg(not(target_arch = "wasm32"))]
//! Properties of the protocol, checked over random histories of attempts, heartbeats,
//! completions, releases and clock jumps against one key.

use idem_core::{
    complete, decide, heartbeat, release, Decision, Fingerprint, Holder, Policy, Record,
    StoredResponse,
};
use proptest::prelude::*;

const P: Policy = Policy {
    lease_ms: 50,
    ttl_ms: 400,
};

#[derive(Clone, Debug)]
enum Op {
    Attempt { fp: u8 },
    Heartbeat { holder: usize },
    Complete { holder: usize, status: u16 },
    Release { holder: usize },
    Sweep,
    Advance { ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..2).prop_map(|fp| Op::Attempt { fp }),
        1 => (0usize..8).prop_map(|holder| Op::Heartbeat { holder }),
        2 => (0usize..8, prop_oneof![Just(201u16), Just(400), Just(500)]).prop_map(|(holder, status)| Op::Complete { holder, status }),
        1 => (0usize..8).prop_map(|holder| Op::Release { holder }),
        1 => Just(Op::Sweep),
        2 => (0u64..200).prop_map(|ms| Op::Advance { ms }),
    ]
}

fn response(status: u16) -> StoredResponse {
    StoredResponse {
        status,
        headers: vec![],
        body: status.to_be_bytes().to_vec(),
    }
}

/// Applies a claim to the one-key store the way an atomic adapter must.
fn apply_claim(stored: &mut Option<Record>, replaces: Option<Record>, record: Record) {
    match replaces {
        None => assert!(stored.is_none(), "insert-if-absent over an existing record"),
        Some(expected) => assert_eq!(
            stored.as_ref(),
            Some(&expected),
            "CAS against a record that is not the one stored"
        ),
    }
    *stored = Some(record);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn histories_keep_the_invariants(ops in proptest::collection::vec(op(), 1..60)) {
        let mut now = 1_000u64;
        let mut stored: Option<Record> = None;
        let mut holders: Vec<Holder> = Vec::new();
        let mut last_token = 0u64;
        for op in ops {
            match op {
                Op::Attempt { fp } => {
                    let fp = Fingerprint([fp; 32]);
                    let before = stored.clone();
                    match decide(stored.as_ref(), &fp, now, &P) {
                        Decision::Execute(c) | Decision::TakeOver(c) => {
                            // A completed, unexpired record is never re-executed.
                            if let Some(Record::Completed { expires_at, .. }) = &before {
                                prop_assert!(now >= *expires_at);
                            }
                            // A running holder is never taken over while its lease lasts:
                            // execution over an in-progress record only once the lease ended.
                            if let Some(Record::InProgress { lease_until, .. }) = &before {
                                prop_assert!(now >= *lease_until, "took over a live lease at {} < {}", now, lease_until);
                            }
                            // Tokens strictly increase.
                            prop_assert!(c.token > last_token);
                            last_token = c.token;
                            holders.push(c.holder());
                            apply_claim(&mut stored, c.replaces, c.record);
                        }
                        Decision::Replay { response: r, expires_at: until } => {
                            // Only the same request replays, and only a completed record.
                            match &before {
                                Some(Record::Completed { fingerprint, response, expires_at, .. }) => {
                                    prop_assert_eq!(fingerprint, &fp);
                                    prop_assert_eq!(response, &r);
                                    prop_assert_eq!(*expires_at, until);
                                    prop_assert!(now < *expires_at);
                                }
                                other => prop_assert!(false, "replay of {:?}", other),
                            }
                        }
                        Decision::Mismatch => {
                            let r = before.as_ref().expect("mismatch without a record");
                            prop_assert_ne!(r.fingerprint(), &fp);
                        }
                        Decision::InFlight { lease_until } => {
                            let running = matches!(before, Some(Record::InProgress { .. }));
                            prop_assert!(running);
                            prop_assert!(now < lease_until);
                        }
                    }
                }
                Op::Heartbeat { holder } => {
                    if let Some(h) = holders.get(holder) {
                        if let Ok(r) = heartbeat(stored.as_ref(), h, now, &P) {
                            prop_assert_eq!(stored.as_ref().map(Record::token), Some(h.token));
                            stored = Some(r);
                        }
                    }
                }
                Op::Complete { holder, status } => {
                    if let Some(h) = holders.get(holder) {
                        let current = stored.as_ref().map(Record::token);
                        match complete(stored.as_ref(), h, response(status), now, &P) {
                            Ok(r) => {
                                // Only the newest holder of an in-progress record completes.
                                prop_assert_eq!(current, Some(h.token));
                                prop_assert_eq!(h.token, last_token);
                                stored = Some(r);
                            }
                            // Refused: another holder's, completed, or a claim that expired
                            // (released, or kept past its retention).
                            Err(_) => prop_assert!(
                                current != Some(h.token)
                                    || stored.as_ref().is_some_and(|r| r.is_completed() || now >= r.expires_at())
                            ),
                        }
                    }
                }
                Op::Release { holder } => {
                    if let Some(h) = holders.get(holder) {
                        if let Ok(r) = release(stored.as_ref(), h, now) {
                            prop_assert_eq!(h.token, last_token);
                            stored = Some(r);
                        }
                    }
                }
                Op::Sweep => {
                    if stored.as_ref().is_some_and(|r| now > r.expires_at()) {
                        stored = None;
                    }
                }
                Op::Advance { ms } => now += ms,
            }
        }
    }

    #[test]
    fn a_different_request_never_replays(a: [u8; 32], b: [u8; 32], now in 0u64..1_000_000, age in 0u64..1_000_000) {
        prop_assume!(a != b);
        let record = Record::Completed { fingerprint: Fingerprint(a), token: 1, response: response(201), expires_at: now + age };
        let d = decide(Some(&record), &Fingerprint(b), now, &P);
        prop_assert!(matches!(d, Decision::Mismatch | Decision::Execute(_)));
        if let Decision::Execute(_) = d { prop_assert!(now >= record.expires_at()); }
    }

    #[test]
    fn a_stale_holder_never_completes(start in 0u64..1_000_000, late in 0u64..10_000, takeovers in 1usize..5) {
        let fp = Fingerprint([9; 32]);
        let Decision::Execute(first) = decide(None, &fp, start, &P) else { panic!() };
        let mut record = first.record.clone();
        let mut now = start;
        for _ in 0..takeovers {
            now += P.lease_ms;
            let Decision::TakeOver(next) = decide(Some(&record), &fp, now, &P) else { panic!() };
            record = next.record;
        }
        let res = complete(Some(&record), &first.holder(), response(201), now + late, &P);
        prop_assert!(res.is_err());
    }
}
