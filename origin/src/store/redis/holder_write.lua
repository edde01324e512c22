-- A holder's write (heartbeat, complete, release), under idem_core::Holder::check's
-- precondition: the record is in progress (state 0) and still carries the holder's token.
-- Returns {1} when written, else {0, current record or nil} so the core can say why.
-- KEYS[1] idem:{<record key>}   ARGV: token, state, record, pexpireat
local cur = redis.call('HMGET', KEYS[1], 't', 's', 'r')
if cur[1] == ARGV[1] and cur[2] == '0' then
  redis.call('HSET', KEYS[1], 's', ARGV[2], 'r', ARGV[3])
  redis.call('PEXPIREAT', KEYS[1], ARGV[4])
  return {1}
end
return {0, cur[3]}
