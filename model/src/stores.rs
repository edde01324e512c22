//! The stores' atomic primitives, as the adapters execute them: each is one Lua
//! script, one SQL statement or one locked section. They hold the record's encoded
//! bytes and judge time on their own clock.

use crate::config::Bug;
use idem_core::{Holder, Millis, Record, Refusal, Stamp};

/// One store's record for the key, and its clock's offset from the true clock.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Slot {
    /// The stored bytes ([`Record::encode`]).
    pub bytes: Option<Vec<u8>>,
    /// This store's clock minus the true clock, in ms.
    pub offset: i64,
}

/// What an insert-if-absent found (the adapters' `Insert`).
pub enum Insert {
    Stored,
    Existing(Record),
    Skewed,
}

/// What a compare-and-swap did (the adapters' `Swap`).
#[derive(PartialEq, Eq)]
pub enum Swap {
    Replaced,
    Changed,
    Skewed,
}

/// What a guarded holder write did (the adapters' `Written`).
pub enum Written {
    Done,
    Refused(Option<Record>),
    Skewed,
}

impl Slot {
    /// The record, decoded from what the store holds.
    pub fn record(&self) -> Option<Record> {
        self.bytes.as_ref().map(|b| {
            Record::decode(b).unwrap_or_else(|e| panic!("a stored record must decode: {e}"))
        })
    }

    /// The store's clock when the true clock reads `t`.
    pub fn now(&self, t: Millis) -> Millis {
        t.saturating_add_signed(self.offset)
    }

    /// Stores `record`, encoded.
    pub fn put(&mut self, record: &Record) {
        self.bytes = Some(record.encode());
    }

    /// Whether a record computed at `stamp` is accepted at true time `t` (before the
    /// store's clock judged, anything was).
    fn accepts(&self, stamp: Stamp, t: Millis, bug: Option<Bug>) -> bool {
        bug == Some(Bug::ReplicaClock) || stamp.accepted_by(self.now(t))
    }

    /// `insert_if_absent.lua` / `CLAIM_INSERT`: an existing record is returned as it is;
    /// otherwise ours is stored if its stamp is within the tolerance.
    pub fn insert_if_absent(
        &mut self,
        record: &Record,
        stamp: Stamp,
        t: Millis,
        bug: Option<Bug>,
    ) -> Insert {
        if let Some(existing) = self.record() {
            return Insert::Existing(existing);
        }
        if !self.accepts(stamp, t, bug) {
            return Insert::Skewed;
        }
        self.put(record);
        Insert::Stored
    }

    /// `replace_if_same.lua` / `REPLACE`: swap only if the bytes are still exactly
    /// `expected`'s (every field, not just the token).
    pub fn replace(
        &mut self,
        expected: &Record,
        record: &Record,
        stamp: Stamp,
        t: Millis,
        bug: Option<Bug>,
    ) -> Swap {
        let same = match bug {
            Some(Bug::TokenOnlySwap) => self.record().map(|r| r.token()) == Some(expected.token()),
            _ => self.bytes.as_deref() == Some(expected.encode().as_slice()),
        };
        if !same {
            return Swap::Changed;
        }
        if !self.accepts(stamp, t, bug) {
            return Swap::Skewed;
        }
        self.put(record);
        Swap::Replaced
    }

    /// `holder_write.lua` / `HOLDER_WRITE`: write `record` only if the stored one is in
    /// progress under the holder's token ([`Holder::check`]) and the stamp is accepted.
    pub fn holder_write(
        &mut self,
        holder: &Holder,
        record: &Record,
        stamp: Stamp,
        t: Millis,
        bug: Option<Bug>,
    ) -> Written {
        let current = self.record();
        // Judged at the store's time, as the scripts and statements do.
        let refused = match holder.check(current.as_ref(), self.now(t)) {
            Ok(()) => false,
            Err(_) if bug == Some(Bug::UnguardedHolderWrite) => false,
            // Before d306f92 an expired claim under the holder's token took its writes.
            Err(Refusal::Missing)
                if bug == Some(Bug::HolderWriteOverExpired)
                    && current
                        .as_ref()
                        .is_some_and(|c| c.token() == holder.token && !c.is_completed()) =>
            {
                false
            }
            Err(_) => true,
        };
        if refused {
            return Written::Refused(current);
        }
        if !self.accepts(stamp, t, bug) {
            return Written::Skewed;
        }
        self.put(record);
        Written::Done
    }

    /// `mirror.lua`: copy a record in unless the store holds one it supersedes.
    pub fn mirror(&mut self, record: &Record) -> bool {
        match self.record() {
            Some(current) if !record.supersedes(&current) => false,
            _ => {
                self.put(record);
                true
            }
        }
    }

    /// `UPSERT_SUPERSEDING`, the write-behind upsert (expiry judged at the written
    /// record's claim time, not on this store's clock).
    pub fn write_behind(&mut self, record: &Record) -> bool {
        if record.may_write_behind(self.record().as_ref()) {
            self.put(record);
            true
        } else {
            false
        }
    }
}
