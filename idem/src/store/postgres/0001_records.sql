-- One row per (scope, key). `record` is the core's versioned encoding; the other
-- columns exist so that SQL can express the core's preconditions and the sweep.
CREATE TABLE idem_records (
    id          text     PRIMARY KEY,   -- RecordKey: 64 hex characters
    token       bigint   NOT NULL,      -- fencing token of the holder that wrote it
    state       smallint NOT NULL,      -- 0 in progress, 1 completed (Record::state_code)
    expires_at  bigint   NOT NULL,      -- ms since epoch (Record::expires_at)
    record      bytea    NOT NULL
);
CREATE INDEX idem_records_expires_at ON idem_records (expires_at);
