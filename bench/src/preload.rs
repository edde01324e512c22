//! Records in bulk, for the scale bench: for keys `<prefix>-<i>`, exactly the completed
//! record the origin stores when it answers `load::body(key)` (same record key, same
//! fingerprint, a response taken from a real one), written with binary `COPY` into
//! Postgres and with pipelines straight to each Redis Cluster master.

use anyhow::{bail, Context, Result};
use idem::IdColumn;
use idem_core::{
    Fingerprint, IdempotencyKey, Millis, Record, RecordKey, RequestParts, Scope, StoredResponse,
    TOKENS_PER_MS,
};
use redis::aio::MultiplexedConnection;
use std::ops::Range;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::Type;

/// Records generated and written together.
const CHUNK: u64 = 10_000;

/// One record, ready for either store.
struct Prepared {
    /// The record key as hex text, and as its bytes.
    id: String,
    id_bytes: Vec<u8>,
    token: i64,
    state: i16,
    expires_at: i64,
    delete_after: u64,
    record: Vec<u8>,
}

/// What every preloaded record carries.
#[derive(Clone)]
pub struct Shape {
    /// The answer replayed for every key (a real one's: status, headers, body).
    pub response: StoredResponse,
    /// When the records were completed.
    pub now: Millis,
    /// Their expiry; in the past for rows the sweeper is to delete.
    pub expires_at: Millis,
}

/// Where records go: Postgres's `idem_records`, a Redis Cluster, or both.
pub struct Targets<'a> {
    pub pg: Option<&'a tokio_postgres::Client>,
    pub cluster: Option<&'a Cluster>,
}

/// The record keys `<prefix>-<i>` for `i` in `range`, written to `targets`. Generation
/// runs on blocking threads, two chunks ahead of the writes.
pub async fn write(
    targets: &Targets<'_>,
    prefix: &str,
    range: Range<u64>,
    shape: &Shape,
) -> Result<u64> {
    let (tx, mut rx) = mpsc::channel::<Arc<Vec<Prepared>>>(2);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let mut generators = Vec::new();
    for w in 0..workers {
        let (tx, prefix, shape, range) =
            (tx.clone(), prefix.to_string(), shape.clone(), range.clone());
        generators.push(tokio::spawn(async move {
            let mut start = range.start + w * CHUNK;
            while start < range.end {
                let chunk = start..(start + CHUNK).min(range.end);
                let (prefix, shape) = (prefix.clone(), shape.clone());
                let rows =
                    tokio::task::spawn_blocking(move || prepare(&prefix, chunk, &shape)).await??;
                if tx.send(Arc::new(rows)).await.is_err() {
                    break;
                }
                start += workers * CHUNK;
            }
            anyhow::Ok(())
        }));
    }
    drop(tx);
    let id_column = match targets.pg {
        Some(pg) => Some(crate::backend::id_column(pg).await?),
        None => None,
    };
    let copy = match targets.pg {
        Some(pg) => {
            let id_type = match id_column {
                Some(IdColumn::Text) => Type::TEXT,
                _ => Type::BYTEA,
            };
            let sink = pg
                .copy_in(
                    "COPY idem_records (id, token, state, expires_at, record) FROM STDIN BINARY",
                )
                .await
                .context("starting COPY into idem_records")?;
            let types = [id_type, Type::INT8, Type::INT2, Type::INT8, Type::BYTEA];
            Some(Box::pin(BinaryCopyInWriter::new(sink, &types)))
        }
        None => None,
    };
    let mut copy = copy;
    let mut written = 0;
    while let Some(rows) = rx.recv().await {
        let to_pg = async {
            if let Some(w) = copy.as_mut() {
                for r in rows.iter() {
                    let id: &(dyn tokio_postgres::types::ToSql + Sync) = match id_column {
                        Some(IdColumn::Text) => &r.id,
                        _ => &r.id_bytes,
                    };
                    w.as_mut()
                        .write(&[id, &r.token, &r.state, &r.expires_at, &r.record])
                        .await
                        .context("COPY into idem_records")?;
                }
            }
            anyhow::Ok(())
        };
        let to_redis = async {
            match targets.cluster {
                Some(c) => c.write(&rows).await,
                None => Ok(()),
            }
        };
        tokio::try_join!(to_pg, to_redis)?;
        written += rows.len() as u64;
    }
    for g in generators {
        g.await.context("a record generator panicked")??;
    }
    if let Some(mut w) = copy {
        w.as_mut()
            .finish()
            .await
            .context("finishing COPY into idem_records")?;
    }
    if written != range.end - range.start {
        bail!("wrote {written} records of {}", range.end - range.start);
    }
    Ok(written)
}

/// The bytes a string of hex digits spells.
fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

fn prepare(prefix: &str, range: Range<u64>, shape: &Shape) -> Result<Vec<Prepared>> {
    let scope = Scope::from_authorization(None);
    let token = shape.now * TOKENS_PER_MS;
    range
        .map(|i| {
            let key = format!("{prefix}-{i}");
            // As the load generator sends it: an sf-string.
            let parsed = IdempotencyKey::parse(format!("\"{key}\"").as_bytes())
                .map_err(|e| anyhow::anyhow!("key {key}: {e:?}"))?;
            let body = crate::load::body(&key);
            let record = Record::Completed {
                fingerprint: Fingerprint::of(&RequestParts {
                    method: "POST",
                    path_and_query: "/v1/charges",
                    content_type: Some("application/json"),
                    body: &body,
                }),
                token,
                response: shape.response.clone(),
                expires_at: shape.expires_at,
            };
            let id = RecordKey::new(&scope, &parsed).as_str().to_string();
            Ok(Prepared {
                id_bytes: hex_bytes(&id),
                id,
                token: i64::try_from(record.token())?,
                state: i16::from(record.state_code()),
                expires_at: i64::try_from(record.expires_at())?,
                delete_after: record.delete_after(),
                record: record.encode(),
            })
        })
        .collect()
}

/// A Redis Cluster's masters and which slots each serves, for writes that bypass the
/// cluster client: one pipeline per master and chunk.
pub struct Cluster {
    namespace: String,
    masters: Vec<MultiplexedConnection>,
    /// Index into `masters`, by slot.
    slot_owner: Vec<usize>,
}

impl Cluster {
    /// Reads the slot map (`CLUSTER SLOTS`) from the first seed that answers.
    pub async fn connect(seeds: &[String], namespace: &str) -> Result<Self> {
        let mut last = None;
        for seed in seeds {
            match slot_map(seed).await {
                Ok((masters, slot_owner)) => {
                    let mut conns = Vec::new();
                    for m in &masters {
                        conns.push(
                            redis::Client::open(m.as_str())?
                                .get_multiplexed_async_connection()
                                .await
                                .with_context(|| format!("connecting to {m}"))?,
                        );
                    }
                    return Ok(Cluster {
                        namespace: namespace.to_string(),
                        masters: conns,
                        slot_owner,
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no Redis Cluster seed URL given")))
    }

    /// The record stored under a record key, if any.
    pub async fn read(&self, id: &str) -> Result<Option<Vec<u8>>> {
        let key = format!("{}:{{{}}}", self.namespace, id);
        let mut conn = self.masters[self.slot_owner[usize::from(slot(id.as_bytes()))]].clone();
        Ok(redis::cmd("GET").arg(&key).query_async(&mut conn).await?)
    }

    async fn write(&self, rows: &[Prepared]) -> Result<()> {
        let mut pipes: Vec<redis::Pipeline> = self.masters.iter().map(|_| redis::pipe()).collect();
        for r in rows {
            // As the store names it: `<namespace>:{<record key>}`, the record key a hash tag.
            let key = format!("{}:{{{}}}", self.namespace, r.id);
            let owner = self.slot_owner[usize::from(slot(r.id.as_bytes()))];
            // As the store writes it: the record itself, expiring at its delete-after.
            pipes[owner]
                .cmd("SET")
                .arg(&key)
                .arg(&r.record)
                .arg("PXAT")
                .arg(r.delete_after)
                .ignore();
        }
        // One task per master: the pipelines go out side by side.
        let sends: Vec<_> = pipes
            .into_iter()
            .zip(&self.masters)
            .map(|(pipe, conn)| {
                let mut conn = conn.clone();
                tokio::spawn(async move { pipe.query_async::<()>(&mut conn).await })
            })
            .collect();
        for send in sends {
            send.await?
                .context("writing records to a Redis Cluster master")?;
        }
        Ok(())
    }
}

/// The masters' URLs and, for each of the 16384 slots, its master's index.
async fn slot_map(seed: &str) -> Result<(Vec<String>, Vec<usize>)> {
    let mut conn = redis::Client::open(seed)?
        .get_multiplexed_async_connection()
        .await
        .with_context(|| format!("connecting to {seed}"))?;
    let ranges: Vec<(u16, u16, Vec<redis::Value>)> = {
        let raw: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut conn)
            .await?;
        raw.into_iter()
            .filter_map(|entry| {
                let mut it = entry.into_iter();
                let start = redis::from_redis_value::<u16>(it.next()?).ok()?;
                let end = redis::from_redis_value::<u16>(it.next()?).ok()?;
                let master = match it.next()? {
                    redis::Value::Array(v) => v,
                    _ => return None,
                };
                Some((start, end, master))
            })
            .collect()
    };
    let mut masters: Vec<String> = Vec::new();
    let mut owner = vec![usize::MAX; 16384];
    for (start, end, master) in ranges {
        let mut fields = master.into_iter();
        let host: String =
            redis::from_redis_value(fields.next().context("CLUSTER SLOTS: no host")?)?;
        let port: u16 = redis::from_redis_value(fields.next().context("CLUSTER SLOTS: no port")?)?;
        let url = format!("redis://{host}:{port}");
        let index = match masters.iter().position(|m| *m == url) {
            Some(i) => i,
            None => {
                masters.push(url);
                masters.len() - 1
            }
        };
        for s in start..=end {
            owner[usize::from(s)] = index;
        }
    }
    if owner.contains(&usize::MAX) {
        bail!("CLUSTER SLOTS at {seed}: some slots are not served");
    }
    Ok((masters, owner))
}

/// The cluster's slot of a hash tag: CRC16 (XMODEM) mod 16384.
fn slot(tag: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in tag {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // `CLUSTER KEYSLOT foo` is 12182 and `CLUSTER KEYSLOT 123456789` 12739.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"123456789"), 12739);
    }

    #[test]
    fn prepared_records_decode_as_completed_answers() {
        let shape = Shape {
            response: StoredResponse {
                status: 201,
                headers: vec![("content-type".into(), b"application/json".to_vec())],
                body: b"{}".to_vec(),
            },
            now: 1_700_000_000_000,
            expires_at: 1_700_003_600_000,
        };
        let rows = prepare("k", 0..3, &shape).unwrap();
        assert_eq!(rows.len(), 3);
        assert_ne!(rows[0].id, rows[1].id);
        assert_eq!(rows[0].id.len(), 64);
        let record = Record::decode(&rows[2].record).unwrap();
        assert!(record.is_completed());
        assert_eq!(record.expires_at(), shape.expires_at);
        assert_eq!(rows[2].delete_after, record.delete_after());
    }
}
