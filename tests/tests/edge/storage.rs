//! The Durable Objects' storage, read as workerd wrote it: records as bytes, expired by their alarm, never taken for absent when unreadable.

use super::*;

/// The Durable Object's storage as workerd wrote it: the record is bytes (not hex, at
/// twice the size), and its alarm deletes it once the origin's record has expired —
/// not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_stores_records_as_bytes_and_its_alarm_deletes_them_at_expiry() {
    let ttl = Duration::from_secs(8);
    let body_len = 40 * 1024;
    let (origin, runs) = origin_with_large_answers(ttl, body_len).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    // The origin's record expires `ttl` after its write, which comes after this.
    let stored_at = Instant::now();
    let first = post(&http, &edge.base, "bytes-1", "{}".into(), false).await;
    assert_eq!(first.status(), 201);
    assert_eq!(first.headers()["idem-edge"], "forwarded");
    let records = edge.stored_records();
    let retry = post(&http, &edge.base, "bytes-1", "{}".into(), false).await;
    let retry_edge = retry.headers()["idem-edge"].to_str().unwrap().to_owned();
    assert_eq!(retry.bytes().await.unwrap().len(), body_len);
    // Half-way through the TTL it is still there; once past it (and the 1 s grace), the
    // alarm has removed it.
    tokio::time::sleep(ttl / 2).await;
    let halfway = edge.stored_records().len();
    let deadline = stored_at + ttl + Duration::from_secs(15);
    let gone_after = loop {
        if edge.stored_records().is_empty() {
            break Some(stored_at.elapsed());
        }
        if Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let sizes: Vec<usize> = records.iter().map(|(_, len, _)| *len).collect();
    report(
        "edge",
        &format!(
            "a {body_len}-byte answer kept at the edge: stored values of {sizes:?} bytes; \
             the retry {retry_edge}; records half-way through the {ttl:?} TTL: {halfway}; \
             deleted by the alarm after {gone_after:?}; {} execution",
            runs.load(std::sync::atomic::Ordering::SeqCst)
        ),
    );
    assert_eq!(sizes.len(), 1, "one record, in one object");
    assert!(
        sizes[0] > body_len && sizes[0] < body_len + 1024,
        "stored as bytes: {} bytes for a {body_len}-byte body",
        sizes[0]
    );
    assert_eq!(retry_edge, "replayed");
    assert_eq!(halfway, 1, "not deleted before it expired");
    let gone_after = gone_after.expect("the alarm deleted the expired record");
    assert!(
        gone_after >= ttl,
        "deleted after {gone_after:?}, before the TTL"
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A claim the edge lost track of — its release never landed (the object reset, the
/// write failed, the edge cut off), so its record is still the claim, past its lease —
/// does not bind the key at the edge: the corrected request (another body) is sent on,
/// unclaimed, and the origin, which released the key, runs it. Before, the edge refused it 422 for
/// the key's whole TTL while the origin would have run it. The lost release is made by
/// hand: the edge stopped, its object's record rewritten to the claim as it stood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_edge_lost_track_of_does_not_bind_the_key_there() {
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let (origin, ledger) = TestOrigin::demo_on(store).await;
    let edge = Edge::start(&origin.url(""), &[("LEASE_MS", "1000")]).await;
    let http = client();
    // Rejected by the handler, which releases the key for the corrected request.
    let invalid = r#"{"amount":-5,"currency":"usd","customer":"cus-lost"}"#.to_owned();
    let first = post(&http, &edge.base, "lost-1", invalid, false).await;
    assert_eq!(first.status(), 400);
    let records = edge.stored_records();
    assert_eq!(records.len(), 1, "{records:?}");
    let (object, _, hex) = records[0].clone();
    let state = edge.state.clone();
    drop(edge);
    // The record as a claim whose release was lost: in progress, its lease over, kept
    // for the TTL. Found in the stored value by its layout (version 1, in progress, the
    // token of a claim made in the last two minutes).
    let mut value: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let now = idem::now();
    let at = (0..value.len().saturating_sub(57))
        .find(|&i| {
            let token = u64::from_be_bytes(value[i + 34..i + 42].try_into().unwrap());
            value[i] == 1
                && value[i + 1] == 0
                && (now.saturating_sub(120_000)..=now).contains(&(token / 1024))
        })
        .expect("the stored claim's record");
    value[at + 42..at + 50].copy_from_slice(&(now - 5_000).to_be_bytes());
    value[at + 50..at + 58].copy_from_slice(&(now + 86_400_000).to_be_bytes());
    let rewritten: String = value.iter().map(|b| format!("{b:02X}")).collect();
    sqlite(
        &object,
        &format!("UPDATE _cf_KV SET value = X'{rewritten}' WHERE key = 'record'"),
    );
    let edge = Edge::launch_in(state, &origin.url(""), &[("LEASE_MS", "1000")], |status| {
        status == 200
    })
    .await;
    let corrected = post(
        &http,
        &edge.base,
        "lost-1",
        charge_body("cus-lost", 100, 0),
        false,
    )
    .await;
    let status = corrected.status().as_u16();
    let from = handled_by(&corrected);
    let retry = post(
        &http,
        &edge.base,
        "lost-1",
        charge_body("cus-lost", 100, 0),
        false,
    )
    .await;
    let retried = (
        retry.status().as_u16(),
        handled_by(&retry),
        retry.headers().contains_key("idempotent-replayed"),
    );
    let charges = ledger.count_for_key("lost-1");
    report(
        "edge",
        &format!(
            "a claim whose release the edge lost, past its lease: the corrected request {status} ({from}), its retry {retried:?}; {charges} charge"
        ),
    );
    assert_eq!(
        (status, from.as_str()),
        (201, "forwarded"),
        "the origin runs it"
    );
    // Sent on again (the edge keeps its record for the attempt it lost track of), and
    // replayed by the origin.
    assert_eq!(retried, (201, "forwarded".to_owned(), true));
    assert_eq!(charges, 1);
}

/// A stored value the edge cannot decode (damaged, or a newer version's encoding) is
/// not "no record": a retry goes to the origin (which replays), nothing overwrites it,
/// and its alarm, fired, does not delete it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_the_edge_cannot_read_is_neither_overwritten_nor_deleted() {
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let (origin, ledger) = TestOrigin::demo_on(store).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    let body = charge_body("cus-damaged", 100, 0);
    let first = post(&http, &edge.base, "damaged-1", body.clone(), false).await;
    assert_eq!(first.status(), 201);
    let records = edge.stored_records();
    assert_eq!(records.len(), 1, "{records:?}");
    let object = records[0].0.clone();
    // Stopped, the value is replaced by a V8-serialised string that is no record
    // ("zz"), and the object's alarm (kept in the object's own `_cf_METADATA`, row 1,
    // in nanoseconds) is brought forward to now: it fires as soon as the edge is up
    // again on the same storage.
    let due;
    let edge = {
        let state = edge.state.clone();
        drop(edge);
        const DAMAGED: &str = "FF0F22027A7A";
        sqlite(
            &object,
            &format!("UPDATE _cf_KV SET value = X'{DAMAGED}' WHERE key = 'record'"),
        );
        let alarm = sqlite(&object, "SELECT value FROM _cf_METADATA WHERE key = 1");
        assert!(
            alarm.trim().parse::<u64>().unwrap() > idem::now() * 1_000_000,
            "the object's alarm is set, in ns: {alarm:?}"
        );
        due = idem::now() * 1_000_000;
        sqlite(
            &object,
            &format!("UPDATE _cf_METADATA SET value = {due} WHERE key = 1"),
        );
        sqlite(
            &object.with_file_name("metadata.sqlite"),
            &format!("UPDATE _cf_ALARM SET scheduled_time = {}", due / 1_000_000),
        );
        Edge::launch_in(state, &origin.url(""), &[], |status| status == 200).await
    };
    // The alarm fires at start-up: wait until it has (the object's alarm moves on, or
    // the record is gone).
    let due_text = due.to_string();
    let fired_by = Instant::now() + Duration::from_secs(20);
    loop {
        let alarm = try_sqlite(&object, "SELECT value FROM _cf_METADATA WHERE key = 1");
        let moved = alarm.as_deref().map(str::trim).ok() != Some(due_text.as_str());
        if moved || Instant::now() > fired_by {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after_alarm: Vec<String> = edge.stored_records().into_iter().map(|r| r.2).collect();
    let retry = post(&http, &edge.base, "damaged-1", body, false).await;
    let retry_status = retry.status().as_u16();
    let retry_edge = retry.headers()["idem-edge"].to_str().unwrap().to_owned();
    let retry_replayed = retry.headers().get("idempotent-replayed").is_some();
    let after: Vec<String> = edge.stored_records().into_iter().map(|r| r.2).collect();
    let rearmed = edge
        .stored_records()
        .first()
        .map(|(object, ..)| sqlite(object, "SELECT value FROM _cf_METADATA WHERE key = 1"));
    let charges = ledger.len();
    report(
        "edge",
        &format!(
            "a damaged edge record: the stored value once its alarm fired: {after_alarm:?}; \
             the retry {retry_status} {retry_edge} (replayed by the origin: {retry_replayed}); \
             the value after it: {after:?}; the alarm now at {rearmed:?} ns; {charges} charge"
        ),
    );
    assert_eq!(after_alarm, ["FF0F22027A7A"], "the alarm did not delete it");
    let rearmed_ms = rearmed
        .as_deref()
        .and_then(|ns| ns.trim().parse::<u64>().ok())
        .map(|ns| ns / 1_000_000)
        .unwrap_or(0);
    let now = idem::now();
    assert!(
        rearmed_ms > now + 30 * 60_000 && rearmed_ms < now + 2 * 3_600_000,
        "the alarm fired and looks again in an hour: {rearmed:?}"
    );
    assert_eq!(
        (retry_status, retry_edge.as_str(), retry_replayed),
        (201, "degraded", true),
        "the origin answers a key the edge cannot read"
    );
    assert_eq!(after, ["FF0F22027A7A"], "neither overwritten nor deleted");
    assert_eq!(charges, 1);
}
