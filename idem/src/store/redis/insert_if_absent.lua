-- Claim a key that has no record: store ARGV's record only if KEYS[1] is absent and
-- the caller's clock (ARGV[5]) is within ARGV[6] ms of this server's.
-- Returns {0, now} when stored, {1, now, existing record} when the key has one (the
-- core then decides at `now`), {2, now} when the clocks disagree (nothing written).
-- KEYS[1] idem:{<record key>}   ARGV: token, state, record, pexpireat, now, tolerance
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local current = redis.call('HGET', KEYS[1], 'r')
if current then
  return {1, now, current}
end
if math.abs(now - tonumber(ARGV[5])) > tonumber(ARGV[6]) then
  return {2, now}
end
redis.call('HSET', KEYS[1], 't', ARGV[1], 's', ARGV[2], 'r', ARGV[3])
redis.call('PEXPIREAT', KEYS[1], ARGV[4])
return {0, now}
