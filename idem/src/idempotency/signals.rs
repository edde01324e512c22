//! idem's private signals on a handler's answer: response extensions only idem's own
//! code sets, removed before the client sees the answer.

use super::ReleaseSignal;
use http::Extensions;
use idem_core::Record;

/// A committed completion: the handler's transaction wrote the record.
#[derive(Clone, Debug)]
pub(crate) struct Committed(pub(crate) Record);

/// The handler lost its claim and nothing it did was kept.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FencedSignal;

/// What an answer signalled.
pub(crate) struct Signals {
    /// "Nothing happened": free the key ([`crate::idempotency::release`]).
    pub(crate) released: bool,
    /// The completion its transaction committed.
    pub(crate) committed: Option<Record>,
    /// It was fenced out.
    pub(crate) fenced: bool,
}

/// Removes the signals from an answer's extensions.
pub(crate) fn take(extensions: &mut Extensions) -> Signals {
    Signals {
        released: extensions.remove::<ReleaseSignal>().is_some(),
        committed: extensions
            .remove::<Committed>()
            .map(|Committed(record)| record),
        fenced: extensions.remove::<FencedSignal>().is_some(),
    }
}
