-- A holder's write (heartbeat, complete, release), under idem_core::Holder::check's
-- precondition: the record is in progress (state 0) and still carries the holder's
-- token; and the caller's clock (ARGV[5]) is within ARGV[6] ms of this server's.
-- Returns {1, now} when written, {0, now, current record or nil} when refused (the
-- core says why), {2, now} when the clocks disagree (nothing written).
-- KEYS[1] idem:{<record key>}   ARGV: token, state, record, pexpireat, now, tolerance
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cur = redis.call('HMGET', KEYS[1], 't', 's', 'r')
if cur[1] == ARGV[1] and cur[2] == '0' then
  if math.abs(now - tonumber(ARGV[5])) > tonumber(ARGV[6]) then
    return {2, now}
  end
  redis.call('HSET', KEYS[1], 's', ARGV[2], 'r', ARGV[3])
  redis.call('PEXPIREAT', KEYS[1], ARGV[4])
  return {1, now}
end
return {0, now, cur[3]}
