//! Transactional completion: a handler's effects and its answer commit together.
//!
//! A lease and a fencing token protect the record, not the handler's effects: a
//! process that dies after its effect commits and before its answer is stored, or that
//! is paused past its lease, lets a retry run the handler again. When the effects live
//! in the Postgres database that holds the records, both gaps close for good: the
//! handler writes in a [`Transaction`] from [`IdempotencyContext::transaction`], and
//! [`Transaction::commit`] stores its answer in the same commit — refused, and
//! everything rolled back, if the claim no longer belongs to it.
//!
//! ```no_run
//! use axum::{body::Body, http::{Response, StatusCode}, Extension};
//! use idem::IdempotencyContext;
//!
//! async fn create_charge(Extension(ctx): Extension<IdempotencyContext>) -> Response<Body> {
//!     let tx = match ctx.transaction().await {
//!         Ok(tx) => tx,
//!         Err(e) => return e.into_response(),
//!     };
//!     if let Err(e) = tx
//!         .client()
//!         .execute("INSERT INTO charges (id, amount) VALUES ($1, $2)", &[&"ch_1", &100_i64])
//!         .await
//!     {
//!         tx.rollback().await;
//!         let mut res = Response::new(Body::from(e.to_string()));
//!         *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
//!         return res;
//!     }
//!     let answer = Response::builder().status(StatusCode::CREATED).body(Body::from("charged")).unwrap();
//!     // The charge and the stored answer commit together, or neither does.
//!     tx.commit(answer).await.unwrap_or_else(|e| e.into_response())
//! }
//! ```

use super::response::refusal;
use super::settle::stored_response;
use super::signals::{Committed, FencedSignal};
use super::{release, Config, IdempotencyContext};
use crate::store::postgres::{Authority, BeginError, CommitError, FencedTransaction};
use axum::body::Body;
use deadpool_postgres::ClientWrapper;
use http::Response;
use http_body_util::BodyExt;
use idem_core::contract::{Problem, Rejection};
use idem_core::Holder;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What the layer needs to open a transaction for an execution.
#[derive(Clone)]
pub(crate) struct Completion {
    pub(crate) authority: Authority,
    pub(crate) holder: Holder,
    pub(crate) config: Arc<Config>,
    /// Set once the handler opened a transaction: its commit may have landed even if
    /// its answer never reached the layer (cut off, panicked).
    pub(crate) opened: Arc<AtomicBool>,
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("token", &self.holder.token)
            .field("written_behind", &self.authority.is_behind())
            .finish()
    }
}

/// The layer built with [`super::IdempotencyLayer::transactional`] needs a store
/// whose authoritative records are in Postgres, claimed safely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionsUnsupported {
    /// The store's name.
    pub store: &'static str,
    /// Why not.
    pub reason: &'static str,
}

impl std::fmt::Display for TransactionsUnsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "transactional completion is not possible on the {} store: {}",
            self.store, self.reason
        )
    }
}

impl std::error::Error for TransactionsUnsupported {}

/// Why a handler's transaction did not commit. [`TransactionError::into_response`]
/// turns it into the answer for a handler whose only effects were in the transaction.
#[derive(Debug)]
pub enum TransactionError {
    /// The layer was not built with [`super::IdempotencyLayer::transactional`].
    NotEnabled,
    /// This execution lost its claim to a newer attempt (its lease ran out while it
    /// was paused or cut off): everything was rolled back.
    Fenced,
    /// The database failed before the commit: everything was rolled back.
    Unavailable(String),
    /// The commit was sent and its acknowledgement lost: it may have landed.
    Unknown(String),
    /// The answer is larger than the layer's stored-body limit: nothing was committed.
    TooLarge(usize),
}

impl std::fmt::Display for TransactionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransactionError::NotEnabled => f.write_str("transactional completion is not enabled on the idempotency layer"),
            TransactionError::Fenced => f.write_str(Problem::Fenced.detail()),
            TransactionError::Unavailable(e) => write!(f, "the database failed; the transaction was rolled back: {e}"),
            TransactionError::Unknown(e) => write!(f, "the commit's outcome is unknown: {e}"),
            TransactionError::TooLarge(limit) => write!(f, "the answer is larger than {limit} bytes, the most idem stores; the transaction was rolled back"),
        }
    }
}

impl std::error::Error for TransactionError {}

impl TransactionError {
    /// The answer for a handler whose effects were all in the transaction:
    ///
    /// * fenced: a `409` `…:fenced` problem, stored nowhere — a retry gets the result
    ///   of the attempt that took over;
    /// * rolled back, or outcome unknown: a `503` problem sent with idem's release
    ///   signal. Nothing happened, so the key is freed — unless the commit did land,
    ///   in which case the release is refused and the client gets the committed answer.
    pub fn into_response(self) -> Response<Body> {
        let detail = self.to_string();
        match self {
            TransactionError::Fenced => {
                let mut res = refusal(&Rejection::new(Problem::Fenced));
                res.extensions_mut().insert(FencedSignal);
                res
            }
            TransactionError::NotEnabled => {
                tracing::error!("{detail}");
                release(refusal(&Rejection::with_detail(
                    Problem::HandlerPanicked,
                    detail,
                )))
            }
            TransactionError::TooLarge(_) => release(refusal(&Rejection::with_detail(
                Problem::HandlerFailed,
                detail,
            ))),
            TransactionError::Unavailable(_) | TransactionError::Unknown(_) => release(refusal(
                &Rejection::with_detail(Problem::StoreUnavailable, detail),
            )),
        }
    }
}

impl axum::response::IntoResponse for TransactionError {
    fn into_response(self) -> axum::response::Response {
        TransactionError::into_response(self)
    }
}

impl IdempotencyContext {
    /// Opens a transaction on the database that holds the idempotency records, for
    /// this execution: run the handler's writes on [`Transaction::client`], then
    /// [`Transaction::commit`] its answer with them. Fails with
    /// [`TransactionError::Fenced`] if this execution already lost its claim.
    pub async fn transaction(&self) -> Result<Transaction, TransactionError> {
        let Some(completion) = &self.completion else {
            return Err(TransactionError::NotEnabled);
        };
        completion.opened.store(true, Ordering::Release);
        match completion
            .authority
            .begin(
                &self.record_key,
                &completion.holder,
                &completion.config.policy,
            )
            .await
        {
            Ok(tx) => Ok(Transaction {
                tx,
                config: completion.config.clone(),
            }),
            Err(BeginError::Refused(refusal)) => {
                tracing::warn!(key = %self.key, token = self.token, %refusal, "transaction refused: this execution lost its claim");
                Err(TransactionError::Fenced)
            }
            Err(BeginError::Failed(e)) => Err(TransactionError::Unavailable(e.to_string())),
        }
    }

    /// A key for a downstream service's own idempotency (a payment processor's
    /// `Idempotency-Key`): the same for every attempt at this request — a takeover
    /// after a crash included — and different per scope, key and `purpose`. See
    /// [`idem_core::RecordKey::downstream_key`].
    pub fn downstream_key(&self, purpose: &str) -> String {
        self.record_key.downstream_key(purpose)
    }
}

/// A handler's transaction, fenced by its claim. Dropped without
/// [`Transaction::commit`], it is rolled back.
pub struct Transaction {
    tx: FencedTransaction,
    config: Arc<Config>,
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.tx.fmt(f)
    }
}

impl Transaction {
    /// The transaction's connection (a `tokio_postgres::Client`, with a statement
    /// cache): every statement run on it is part of the transaction.
    pub fn client(&self) -> &ClientWrapper {
        self.tx.client()
    }

    /// Rolls back.
    pub async fn rollback(self) {
        self.tx.rollback().await;
    }

    /// Stores `response` as the request's answer in this transaction and commits, if
    /// this execution still owns its claim; returns the response to send. The layer
    /// then knows the record is complete and writes nothing more.
    pub async fn commit(
        self,
        response: Response<Body>,
    ) -> Result<Response<Body>, TransactionError> {
        let (parts, body) = response.into_parts();
        let signalled = parts.extensions.get::<super::ReleaseSignal>().is_some();
        let released = idem_core::contract::disposition(
            signalled,
            parts.status.as_u16(),
            self.config.release_on,
        ) == idem_core::contract::Disposition::Release;
        if released {
            // "Nothing happened" (signalled, or a status the route releases on): so be
            // it, nothing is committed.
            self.tx.rollback().await;
            return Ok(Response::from_parts(parts, body));
        }
        let limit = self.config.max_stored_body_bytes;
        let body = match http_body_util::Limited::new(body, limit).collect().await {
            Ok(body) => body.to_bytes(),
            Err(_) => {
                self.tx.rollback().await;
                return Err(TransactionError::TooLarge(limit));
            }
        };
        let stored = stored_response(&self.config, &parts, &body);
        match self.tx.commit(stored, &self.config.policy).await {
            Ok(record) => {
                let mut res = Response::from_parts(parts, Body::from(body));
                res.extensions_mut().insert(Committed(record));
                Ok(res)
            }
            Err(CommitError::Refused(refusal)) => {
                tracing::warn!(%refusal, "commit refused: this execution lost its claim; its transaction was rolled back");
                Err(TransactionError::Fenced)
            }
            Err(CommitError::Failed(e)) => Err(TransactionError::Unavailable(e.to_string())),
            Err(CommitError::Unknown(e)) => Err(TransactionError::Unknown(e.to_string())),
        }
    }
}
