//! One conformance suite for every store: the same protocol, whatever executes it.
//! `cargo test -p idem` runs it on the memory store (and the replay cache over it);
//! `idem-tests` on every real backend (`tests/tests/stores.rs`).

use idem::{
    internal::CasRecords, internal::Stamp, internal::Swap, Deletion, HolderWrite, Purged, Store,
    StoreExt,
};
use idem_core::{
    decide, Decision, Fingerprint, IdempotencyKey, Policy, Record, RecordKey, Refusal, Scope,
    StoredResponse,
};
use std::time::Duration;

pub const P: Policy = Policy {
    lease_ms: 1_000,
    ttl_ms: 60_000,
};
pub const FP: Fingerprint = Fingerprint([1; 32]);
pub const OTHER: Fingerprint = Fingerprint([2; 32]);

pub fn key(name: &str) -> RecordKey {
    RecordKey::new(
        &Scope::anonymous(),
        &IdempotencyKey::parse(name.as_bytes()).unwrap(),
    )
}

pub fn response(body: &str) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: body.into(),
    }
}

/// Sleeps `ms` of real time: leases are judged on the store's clock, so the suite lets
/// that clock run rather than passing made-up instants.
pub async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

pub fn lease_until(d: &Decision) -> u64 {
    match d {
        Decision::InFlight { lease_until } => *lease_until,
        other => panic!("expected in flight, got {other:?}"),
    }
}

pub async fn conformance(store: &dyn Store) {
    let now = || store.now();
    let k = key(&format!("conf-{}-{}", store.name(), now()));

    let Decision::Execute(first) = store.claim(&k, &FP, now(), &P).await.unwrap() else {
        panic!("new key executes")
    };
    let Record::InProgress {
        lease_until: first_lease,
        ..
    } = first.record
    else {
        panic!("a claim is in progress")
    };
    assert_eq!(
        lease_until(&store.claim(&k, &FP, now(), &P).await.unwrap()),
        first_lease
    );
    assert_eq!(
        store.claim(&k, &OTHER, now(), &P).await.unwrap(),
        Decision::Mismatch
    );
    sleep_ms(500).await;
    assert_eq!(
        store
            .heartbeat(&k, &first.holder(), now(), &P)
            .await
            .unwrap(),
        HolderWrite::Written
    );
    sleep_ms(600).await; // past the first lease, within the renewed one
    let renewed = lease_until(&store.claim(&k, &FP, now(), &P).await.unwrap());
    assert!(
        renewed >= first_lease + 400,
        "the heartbeat moved the lease"
    );

    // The lease runs out: takeover, and the first holder is fenced out of every write.
    sleep_ms(renewed.saturating_sub(now()) + 50).await;
    let Decision::TakeOver(second) = store.claim(&k, &FP, now(), &P).await.unwrap() else {
        panic!("takeover")
    };
    assert!(second.token > first.token);
    let fenced = HolderWrite::Refused(Refusal::Fenced {
        current: second.token,
    });
    assert_eq!(
        store
            .complete(&k, &first.holder(), response("late"), now(), &P)
            .await
            .unwrap(),
        fenced
    );
    assert_eq!(
        store
            .heartbeat(&k, &first.holder(), now(), &P)
            .await
            .unwrap(),
        fenced
    );
    assert_eq!(
        store.release(&k, &first.holder(), now(), &P).await.unwrap(),
        fenced
    );

    assert_eq!(
        store
            .complete(&k, &second.holder(), response("won"), now(), &P)
            .await
            .unwrap(),
        HolderWrite::Written
    );
    assert_eq!(
        store.claim(&k, &FP, now(), &P).await.unwrap().replayed(),
        Some(&response("won"))
    );
    assert_eq!(
        store.claim(&k, &OTHER, now(), &P).await.unwrap(),
        Decision::Mismatch
    );
    // The same completion sent again (its acknowledgement was lost) landed already: ok.
    assert_eq!(
        store
            .complete(&k, &second.holder(), response("won"), now(), &P)
            .await
            .unwrap(),
        HolderWrite::Written
    );
    assert!(store
        .get(&k)
        .await
        .unwrap()
        .is_some_and(|r| r.is_completed() && r.token() == second.token));

    // A released key is free at once, and its next claim still outranks the releaser.
    let r = key(&format!("conf-release-{}-{}", store.name(), now()));
    let Decision::Execute(c) = store.claim(&r, &FP, now(), &P).await.unwrap() else {
        panic!()
    };
    assert_eq!(
        store.release(&r, &c.holder(), now(), &P).await.unwrap(),
        HolderWrite::Written
    );
    sleep_ms(5).await;
    // A heartbeat the holder sent before its release, landing after it, renews nothing:
    // the released claim has expired. (Before, it locked the freed key again for a TTL,
    // and the corrected request below was refused 422 as another request's.)
    // A release sent again (its first reply lost) is told it landed, not refused.
    assert_eq!(
        store.release(&r, &c.holder(), now(), &P).await.unwrap(),
        HolderWrite::Written,
        "{}: a release sent again",
        store.name()
    );
    let late_beat = store.heartbeat(&r, &c.holder(), now(), &P).await.unwrap();
    assert_eq!(
        late_beat,
        HolderWrite::Refused(Refusal::Missing),
        "{}: a heartbeat after the release",
        store.name()
    );
    let Decision::Execute(again) = store.claim(&r, &OTHER, now(), &P).await.unwrap() else {
        panic!("released key is free")
    };
    assert!(again.token > c.token);
    assert_eq!(
        store
            .complete(&r, &c.holder(), response("stale"), now(), &P)
            .await
            .unwrap(),
        HolderWrite::Refused(Refusal::Fenced {
            current: again.token
        })
    );

    // A heartbeat stamped before its holder's release — its clock read first, its write
    // landing after, as a renewal already sent when the handler said "nothing
    // happened" does — renews nothing either: a released claim is its token's last
    // record, whatever the stamps say. (Before, the heartbeat's earlier stamp was
    // within the released claim's expiry: it renewed the freed key, and the corrected
    // request got 422 for a lease and a TTL.)
    let q = key(&format!("conf-late-beat-{}-{}", store.name(), now()));
    let Decision::Execute(held) = store.claim(&q, &FP, now(), &P).await.unwrap() else {
        panic!()
    };
    let stamp = now();
    assert_eq!(
        store
            .release(&q, &held.holder(), stamp + 60, &P)
            .await
            .unwrap(),
        HolderWrite::Written
    );
    assert_eq!(
        store
            .heartbeat(&q, &held.holder(), stamp, &P)
            .await
            .unwrap(),
        HolderWrite::Refused(Refusal::Missing),
        "{}: a heartbeat stamped before the release, landing after it",
        store.name()
    );
    assert!(
        matches!(
            store.claim(&q, &OTHER, now(), &P).await.unwrap(),
            Decision::Execute(_)
        ),
        "{}: the corrected request runs",
        store.name()
    );
    store.ping().await.unwrap();
}

/// The takeover's compare-and-swap, with the interleavings forced: between the read
/// that decided a takeover and the swap, the slow holder completes — or renews its
/// lease — under the same token. The swap must fail (it compares the whole record),
/// or the holder's answer is destroyed and the handler runs a second time.
pub async fn takeover_swap_sees_the_holder_finish(store: &(impl Store + CasRecords)) {
    let now = || store.now();
    for interleaved in ["complete", "heartbeat"] {
        let k = key(&format!("cas-{interleaved}-{}-{}", store.name(), now()));
        let Decision::Execute(slow) = store.claim(&k, &FP, now(), &P).await.unwrap() else {
            panic!("new key executes")
        };
        sleep_ms(P.lease_ms + 50).await;
        // The retry reads the record and the core decides: the lease has ended.
        let seen = store.get(&k).await.unwrap();
        let Decision::TakeOver(retry) = decide(seen.as_ref(), &FP, now(), &P) else {
            panic!("the lease ended: takeover")
        };
        // The slow holder, still alive, writes under its token in between.
        let holder = slow.holder();
        let wrote = match interleaved {
            "complete" => store.complete(&k, &holder, response("slow"), now(), &P),
            _ => store.heartbeat(&k, &holder, now(), &P),
        };
        assert_eq!(wrote.await.unwrap(), HolderWrite::Written);
        let expected = retry.replaces.as_ref().expect("takeover names the record");
        let (swap, _) = store
            .replace(&k, expected, &retry.record, Stamp::new(now(), &P))
            .await
            .unwrap();
        assert_eq!(
            swap,
            Swap::Changed,
            "{interleaved}: the swap must see the change"
        );
        // And the retry, asking again, replays the slow holder's answer or waits.
        let again = store.claim(&k, &FP, now(), &P).await.unwrap();
        match interleaved {
            "complete" => assert_eq!(again.replayed(), Some(&response("slow"))),
            _ => assert!(matches!(again, Decision::InFlight { .. }), "{again:?}"),
        }
    }
}

/// The admin API's primitives: in-progress records listed page by page (never a
/// completed one, never one claimed after the instant asked), and purges — refused
/// under a live lease unless forced, a compare-and-delete, the key free again after.
pub async fn purges_and_listing(store: &dyn Store) {
    let now = || store.now();
    let tag = now();
    let keys: Vec<RecordKey> = (0..5)
        .map(|i| key(&format!("admin-{}-{tag}-{i}", store.name())))
        .collect();
    let mut holders = Vec::new();
    for k in &keys {
        let Decision::Execute(c) = store.claim(k, &FP, now(), &P).await.unwrap() else {
            panic!("new key executes")
        };
        holders.push(c.holder());
    }
    for i in [3, 4] {
        let done = store
            .complete(&keys[i], &holders[i], response("done"), now(), &P)
            .await
            .unwrap();
        assert_eq!(done, HolderWrite::Written);
    }
    // (The store's clock, as a replica estimates it, may step back a little between
    // claims: the earliest of them, not the first.)
    let first_claim = holders
        .iter()
        .map(|h| h.token / idem_core::TOKENS_PER_MS)
        .min()
        .unwrap();
    sleep_ms(5).await;

    // Page by page, two at a time: exactly our three in-progress keys.
    let ours = |k: &RecordKey| keys.contains(k);
    let mut listed = Vec::new();
    let mut cursor: Option<String> = None;
    for pages in 0.. {
        assert!(pages < 10_000, "listing never ends");
        let page = store
            .in_progress(now() + 1, cursor.as_deref(), 2)
            .await
            .unwrap();
        assert!(page.records.len() <= 2, "a page holds at most its limit");
        for (k, r) in &page.records {
            assert!(!r.is_completed(), "only in-progress records are listed");
            if ours(k) {
                listed.push(k.clone());
            }
        }
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    listed.sort();
    let mut expected = keys[..3].to_vec();
    expected.sort();
    assert_eq!(
        listed,
        expected,
        "{}: each in-progress key once",
        store.name()
    );
    // Claimed before the first claim: none of ours.
    let early = store.in_progress(first_claim, None, 1000).await.unwrap();
    assert!(early.records.iter().all(|(k, _)| !ours(k)));

    // A live lease is not purged unless forced.
    let purged = store.purge(&keys[0], now(), false).await.unwrap();
    assert!(matches!(purged, Purged::LeaseLive(_)), "{purged:?}");
    assert!(store.get(&keys[0]).await.unwrap().is_some());
    let purged = store.purge(&keys[0], now(), true).await.unwrap();
    assert!(
        matches!(purged, Purged::Deleted(Record::InProgress { .. })),
        "{purged:?}"
    );
    assert_eq!(store.get(&keys[0]).await.unwrap(), None);
    assert_eq!(
        store.purge(&keys[0], now(), true).await.unwrap(),
        Purged::Absent
    );
    // Its holder, still running, can no longer write the key.
    let late = store
        .complete(&keys[0], &holders[0], response("late"), now(), &P)
        .await
        .unwrap();
    assert!(matches!(late, HolderWrite::Refused(_)), "{late:?}");

    // A compare-and-delete: a record that changed since it was read stays.
    let stale = store.get(&keys[1]).await.unwrap().unwrap();
    store
        .heartbeat(&keys[1], &holders[1], now() + 1, &P)
        .await
        .unwrap();
    sleep_ms(2).await;
    let renewed = store.get(&keys[1]).await.unwrap().unwrap();
    if renewed != stale {
        assert_eq!(
            store.delete_if_same(&keys[1], &stale, 0).await.unwrap(),
            Deletion::Changed
        );
        assert!(store.get(&keys[1]).await.unwrap().is_some());
    }

    // A completed record is purged without force, and its key runs again.
    let purged = store.purge(&keys[3], now(), false).await.unwrap();
    assert!(
        matches!(purged, Purged::Deleted(Record::Completed { .. })),
        "{purged:?}"
    );
    assert!(matches!(
        store.claim(&keys[3], &FP, now(), &P).await.unwrap(),
        Decision::Execute(_)
    ));
}
