//! The edge's records in memory: [`apply`] over a map, each op and reply sent through
//! JSON as on the Durable Object's wire. Runs the edge's flow on the host — in
//! tests, next to the origin — with the same pure function the Durable Object runs.

use crate::records::{apply, EdgeRecords, Op, Reply};
use idem_core::{Millis, Record, RecordKey};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Every key's record, as the Durable Objects would hold them.
#[derive(Clone)]
pub struct MemoryObjects {
    records: Rc<RefCell<HashMap<String, Record>>>,
    clock: Rc<dyn Fn() -> Millis>,
}

impl MemoryObjects {
    /// Objects that read the time from `clock`.
    pub fn new(clock: impl Fn() -> Millis + 'static) -> Self {
        MemoryObjects {
            records: Rc::default(),
            clock: Rc::new(clock),
        }
    }

    /// The object of `key`.
    pub fn object(&self, key: &RecordKey) -> MemoryObject {
        MemoryObject {
            objects: self.clone(),
            key: key.as_str().to_owned(),
        }
    }

    /// How many keys have a record.
    pub fn len(&self) -> usize {
        self.records.borrow().len()
    }

    /// Whether no key has a record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Loses every record, as an evicted or redeployed edge does.
    pub fn forget_all(&self) {
        self.records.borrow_mut().clear();
    }
}

/// One key's object.
pub struct MemoryObject {
    objects: MemoryObjects,
    key: String,
}

impl EdgeRecords for MemoryObject {
    async fn send(&self, op: &Op) -> Result<Reply, String> {
        let op: Op = through_json(op)?;
        let now = (self.objects.clock)();
        let mut records = self.objects.records.borrow_mut();
        let (reply, write) = apply(&op, records.get(&self.key), now)?;
        if let Some(record) = write {
            records.insert(self.key.clone(), record);
        }
        through_json(&reply)
    }
}

fn through_json<T: serde::Serialize + serde::de::DeserializeOwned>(value: &T) -> Result<T, String> {
    let json = serde_json::to_string(value).map_err(|e| e.to_string())?;
    serde_json::from_str(&json).map_err(|e| e.to_string())
}
