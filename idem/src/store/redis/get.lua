-- Read a record. KEYS[1] idem:{<record key>}
return read_record(KEYS[1])
