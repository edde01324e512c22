-- Read a record. KEYS[1] idem:{<record key>}
return redis.call('HGET', KEYS[1], 'r')
