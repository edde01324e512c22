-- Claim a key that has no record: store ARGV's record only if KEYS[1] is absent.
-- Returns nil when stored, else the existing record (the core then decides).
-- KEYS[1] idem:{<record key>}   ARGV: token, state, record, pexpireat
local current = redis.call('HGET', KEYS[1], 'r')
if current then
  return current
end
redis.call('HSET', KEYS[1], 't', ARGV[1], 's', ARGV[2], 'r', ARGV[3])
redis.call('PEXPIREAT', KEYS[1], ARGV[4])
return false
