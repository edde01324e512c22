-- Compare-and-swap: replace the record only if it still carries the expected token
-- (a takeover, or a claim over an expired record). Returns 1 if replaced, else 0.
-- KEYS[1] idem:{<record key>}   ARGV: expected token, token, state, record, pexpireat
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 't', ARGV[2], 's', ARGV[3], 'r', ARGV[4])
redis.call('PEXPIREAT', KEYS[1], ARGV[5])
return 1
