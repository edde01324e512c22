//! Expired records are deleted in the background, in batches.

use super::Store;
use std::sync::Arc;
use std::time::Duration;

/// Deletes expired records every `interval`, in batches, until the process ends.
pub fn spawn_sweeper(store: Arc<dyn Store>, interval: Duration) -> tokio::task::JoinHandle<()> {
    const BATCH: usize = 1_000;
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            loop {
                let swept =
                    crate::metrics::timed(store.name(), "sweep", store.sweep(crate::now(), BATCH))
                        .await;
                match swept {
                    Ok(n) => {
                        crate::metrics::swept(n);
                        if n < BATCH as u64 {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "sweep failed; will retry");
                        break;
                    }
                }
            }
        }
    })
}
