//! The store's statements, for either way `idem_records` may hold a record's key.
//!
//! Every statement takes keys as 64 hex characters (`RecordKey::as_str`) and returns
//! them so. Tables created by idem 0.2 and later store the key's 32 bytes
//! (`0003_binary_ids.sql`); tables idem 0.1 created store the hex text, until their
//! operator converts them (docs/stores.md, "Postgres"). The statements are written once,
//! with placeholders for the key, and rendered for the table's column at start-up.

/// How `idem_records.id` holds a record's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdColumn {
    /// 64 hex characters (`text`): tables created by idem 0.1.
    Text,
    /// The key's 32 bytes (`bytea`): 66 bytes less per record, in the row and the
    /// primary key's index.
    Bytes,
}

impl IdColumn {
    /// The column as Postgres names its type (`format_type`), if it is one of these.
    pub fn of_type(name: &str) -> Option<IdColumn> {
        match name {
            "text" => Some(IdColumn::Text),
            "bytea" => Some(IdColumn::Bytes),
            _ => None,
        }
    }

    /// `template` for this column: `{id}` is the key parameter `$1`, `{id2}` the key
    /// parameter `$2`, `{ids}` the key column `u.id` of an `unnest`, `{key}` the
    /// column `id` read back as hex text.
    pub fn render(self, template: &str) -> String {
        let key = |expr: &str| match self {
            IdColumn::Text => format!("{expr}::text"),
            IdColumn::Bytes => format!("decode({expr}::text, 'hex')"),
        };
        template
            .replace("{id}", &key("$1"))
            .replace("{id2}", &key("$2"))
            .replace(
                "{ids}",
                match self {
                    IdColumn::Text => "u.id",
                    IdColumn::Bytes => "decode(u.id, 'hex')",
                },
            )
            .replace(
                "{key}",
                match self {
                    IdColumn::Text => "id",
                    IdColumn::Bytes => "encode(id, 'hex')",
                },
            )
    }
}

/// Postgres' clock in ms since the epoch. `clock_timestamp()`, not `now()`: the time
/// the statement runs, not when its transaction began.
macro_rules! clock_ms {
    () => {
        "(extract(epoch FROM clock_timestamp()) * 1000)::int8"
    };
}

/// Insert-if-absent: inserts only when `$6` (the caller's time) is within `$7` ms of
/// the database's clock; returns whether it inserted, the row otherwise, and the clock.
pub(super) const CLAIM_INSERT: &str = concat!(
    "WITH clock AS MATERIALIZED (SELECT ",
    clock_ms!(),
    " AS now),
    ins AS (
        INSERT INTO idem_records (id, token, state, expires_at, record)
        SELECT {id}, $2::int8, $3::int2, $4::int8, $5::bytea FROM clock
        WHERE abs(clock.now - $6::int8) <= $7::int8
        ON CONFLICT (id) DO NOTHING RETURNING 1)
    SELECT (SELECT count(*) FROM ins)::int AS inserted,
           (SELECT record FROM idem_records WHERE id = {id}) AS existing,
           (SELECT now FROM clock) AS now"
);
/// Compare-and-swap on the whole record (`$2`, its exact bytes), under the clock check.
pub(super) const REPLACE: &str = concat!(
    "WITH clock AS MATERIALIZED (SELECT ",
    clock_ms!(),
    " AS now),
    upd AS (
        UPDATE idem_records SET token = $3, state = $4, expires_at = $5, record = $6
        WHERE id = {id} AND record = $2 AND (SELECT abs(now - $7::int8) <= $8::int8 FROM clock)
        RETURNING 1)
    SELECT (SELECT count(*) FROM upd)::int AS replaced, (SELECT now FROM clock) AS now"
);
#[cfg(feature = "testing")]
pub(super) const UPSERT: &str = "INSERT INTO idem_records (id, token, state, expires_at, record)
    VALUES ({id}, $2, $3, $4, $5)
    ON CONFLICT (id) DO UPDATE SET token = EXCLUDED.token, state = EXCLUDED.state,
        expires_at = EXCLUDED.expires_at, record = EXCLUDED.record";
/// A holder's write under [`idem_core::Holder::check`]'s precondition and the clock
/// check; returns whether it wrote, the clock, and the row as it was (to say why not).
/// A released claim (lease and expiry one instant: bytes 43-50 and 51-58 of the
/// record) takes no write: READ COMMITTED rechecks that on the row a concurrent
/// release left, where the clock, read once at the statement's start, would let a
/// heartbeat that waited on the release's lock through.
pub(super) const HOLDER_WRITE: &str = concat!(
    "WITH clock AS MATERIALIZED (SELECT ",
    clock_ms!(),
    " AS now),
    upd AS (
        UPDATE idem_records SET state = $3, expires_at = $4, record = $5
        WHERE id = {id} AND token = $2 AND state = 0
          AND substring(record FROM 43 FOR 8) <> substring(record FROM 51 FOR 8)
          AND expires_at > (SELECT now FROM clock)
          AND (SELECT abs(now - $6::int8) <= $7::int8 FROM clock)
        RETURNING 1)
    SELECT (SELECT count(*) FROM upd)::int AS written, (SELECT now FROM clock) AS now,
           (SELECT record FROM idem_records WHERE id = {id}) AS current"
);
/// The write-behind upsert: many records in one statement, each applied only if it
/// supersedes the stored row — `Record::supersedes` in SQL: (token, phase), a released
/// claim (lease = expiry) past a live one — and never over a
/// completed row that had not expired when the written record's attempt claimed the
/// key (its token ÷ `TOKENS_PER_MS`, 1024): a stale claim must not bury an answer, nor
/// may a holder's later completion replace the one its handler's transaction committed
/// (`Record::may_write_behind`, row by row). Not on this database's clock: the store
/// that decided the claim judged the expiry on its own.
pub(super) const UPSERT_SUPERSEDING: &str =
    "INSERT INTO idem_records (id, token, state, expires_at, record)
    SELECT {ids}, u.token, u.state, u.expires_at, u.record
    FROM unnest($1::text[], $2::int8[], $3::int2[], $4::int8[], $5::bytea[])
        AS u(id, token, state, expires_at, record)
    ON CONFLICT (id) DO UPDATE SET token = EXCLUDED.token, state = EXCLUDED.state,
        expires_at = EXCLUDED.expires_at, record = EXCLUDED.record
    WHERE (EXCLUDED.token, CASE WHEN EXCLUDED.state = 1 THEN 2
              WHEN substring(EXCLUDED.record FROM 43 FOR 8) = substring(EXCLUDED.record FROM 51 FOR 8) THEN 1
              ELSE 0 END)
        >= (idem_records.token, CASE WHEN idem_records.state = 1 THEN 2
              WHEN substring(idem_records.record FROM 43 FOR 8) = substring(idem_records.record FROM 51 FOR 8) THEN 1
              ELSE 0 END)
      AND NOT (idem_records.state = 1 AND idem_records.expires_at > EXCLUDED.token / 1024)";
// The statement above divides by it.
const _: () = assert!(idem_core::TOKENS_PER_MS == 1024);
pub(super) const GET: &str = "SELECT record FROM idem_records WHERE id = {id}";
/// The rows of the keys `$1` that exist, each with its key: many callers' reads in one
/// statement (`batched_reads`). One index lookup per key, whatever the statistics say:
/// the `LIMIT` keeps the lookup a subquery run per key. (`id = ANY(…)` was planned, on
/// a table empty when the statement was prepared, as a sequential scan, and kept so.)
pub(super) const GET_MANY: &str = "SELECT u.id, r.record FROM unnest($1::text[]) AS u(id)
    CROSS JOIN LATERAL (SELECT record FROM idem_records WHERE id = {ids} LIMIT 1) r";
/// The advisory-lock strategy's read: the row and the clock, in the locked transaction.
pub(super) const GET_WITH_CLOCK: &str = concat!(
    "SELECT (SELECT record FROM idem_records WHERE id = {id}) AS record, ",
    clock_ms!(),
    " AS now"
);
/// A read that waits for any transaction holding the row's lock to end.
pub(super) const READ_SETTLED: &str = "SELECT record FROM idem_records WHERE id = {id} FOR SHARE";
/// The key's hex text, whatever the column: every replica locks the same number.
pub(super) const ADVISORY_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext($1::text))";
/// The advisory-lock strategy's writes: conditional, because holder writes don't take
/// the lock (a completion may land between the locked read and the claim's write).
pub(super) const INSERT_LOCKED: &str =
    "INSERT INTO idem_records (id, token, state, expires_at, record)
    VALUES ({id}, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING";
pub(super) const REPLACE_LOCKED: &str =
    "UPDATE idem_records SET token = $3, state = $4, expires_at = $5,
    record = $6 WHERE id = {id} AND record = $2";
/// Deletes rows expired before both the caller's `$1` and the database's clock. The
/// clock is read once, in a subquery: a bound the expiry index can stop at (the volatile
/// call itself is only a filter, and the last batch of a sweep then walked the index of
/// every live record).
pub(super) const SWEEP: &str = concat!(
    "DELETE FROM idem_records WHERE id IN (
    SELECT id FROM idem_records WHERE expires_at < LEAST($1::int8, (SELECT ",
    clock_ms!(),
    ")) ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)"
);
/// Deletes the row only if it still holds exactly `$2` and the database's clock has
/// reached `$3`, and notifies the channel in the same statement: listeners hear of it
/// when it commits, never before, never if not. Returns whether it deleted, and the
/// clock it judged by (so that a refusal says why).
pub(super) const DELETE_IF_SAME: &str = concat!(
    "WITH clock AS MATERIALIZED (SELECT ",
    clock_ms!(),
    " AS now),
    gone AS (
        DELETE FROM idem_records WHERE id = {id} AND record = $2
            AND $3::int8 <= (SELECT now FROM clock) RETURNING {key} AS id),
    told AS (SELECT pg_notify('idem_purge', id) FROM gone)
    SELECT (SELECT count(*) FROM told)::int AS deleted,
           (SELECT now FROM clock) AS now"
);
/// In-progress rows claimed before `$1` (as a token: time × 1024), after key `$2`, in
/// key order — along the partial index of in-progress rows.
pub(super) const IN_PROGRESS: &str = "SELECT {key}, record FROM idem_records
    WHERE state = 0 AND token < $1 AND id > {id2} ORDER BY id LIMIT $3";

/// The statements that name a key, rendered for one table's column.
#[derive(Debug)]
pub(super) struct Sql {
    pub(super) id: IdColumn,
    pub(super) claim_insert: String,
    pub(super) replace: String,
    #[cfg(feature = "testing")]
    pub(super) upsert: String,
    pub(super) holder_write: String,
    pub(super) upsert_superseding: String,
    pub(super) get: String,
    #[cfg_attr(not(feature = "tiered"), allow(dead_code))]
    pub(super) get_many: String,
    pub(super) get_with_clock: String,
    pub(super) read_settled: String,
    pub(super) insert_locked: String,
    pub(super) replace_locked: String,
    pub(super) delete_if_same: String,
    pub(super) in_progress: String,
}

impl Sql {
    pub(super) fn new(id: IdColumn) -> Sql {
        Sql {
            id,
            claim_insert: id.render(CLAIM_INSERT),
            replace: id.render(REPLACE),
            #[cfg(feature = "testing")]
            upsert: id.render(UPSERT),
            holder_write: id.render(HOLDER_WRITE),
            upsert_superseding: id.render(UPSERT_SUPERSEDING),
            get: id.render(GET),
            get_many: id.render(GET_MANY),
            get_with_clock: id.render(GET_WITH_CLOCK),
            read_settled: id.render(READ_SETTLED),
            insert_locked: id.render(INSERT_LOCKED),
            replace_locked: id.render(REPLACE_LOCKED),
            delete_if_same: id.render(DELETE_IF_SAME),
            in_progress: id.render(IN_PROGRESS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_placeholder_is_rendered_for_both_columns() {
        for id in [IdColumn::Text, IdColumn::Bytes] {
            let sql = Sql::new(id);
            for statement in [
                &sql.claim_insert,
                &sql.replace,
                &sql.holder_write,
                &sql.upsert_superseding,
                &sql.get,
                &sql.get_many,
                &sql.get_with_clock,
                &sql.read_settled,
                &sql.insert_locked,
                &sql.replace_locked,
                &sql.delete_if_same,
                &sql.in_progress,
            ] {
                assert!(!statement.contains('{'), "{id:?}: {statement}");
            }
        }
        let bytes = Sql::new(IdColumn::Bytes);
        assert!(bytes.get.ends_with("id = decode($1::text, 'hex')"));
        assert!(bytes
            .in_progress
            .starts_with("SELECT encode(id, 'hex'), record"));
        assert!(bytes.in_progress.contains("id > decode($2::text, 'hex')"));
        let text = Sql::new(IdColumn::Text);
        assert!(text.get.ends_with("id = $1::text"));
        assert!(text.upsert_superseding.contains("SELECT u.id, u.token"));
    }
}
