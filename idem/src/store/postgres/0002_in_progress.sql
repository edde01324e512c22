-- The admin API lists in-progress records (attempts orphaned by a crash) in key order:
-- a partial index holds only those rows, which are few next to the completed ones.
-- Built concurrently (see CONCURRENT_INDEXES): claims go on while it is built.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idem_records_in_progress ON idem_records (id) WHERE state = 0;
