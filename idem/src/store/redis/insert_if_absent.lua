-- Claim a key that has no record: store ARGV's record only if KEYS[1] is absent and
-- the caller's clock (ARGV[3]) is within ARGV[4] ms of this server's.
-- Returns {0, now} when stored, {1, now, existing record} when the key has one (the
-- core then decides at `now`), {2, now} when the clocks disagree (nothing written).
-- KEYS[1] idem:{<record key>}   ARGV: record, pexpireat, now, tolerance
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local current = read_record(KEYS[1])
if current then
  return {1, now, current}
end
if math.abs(now - tonumber(ARGV[3])) > tonumber(ARGV[4]) then
  return {2, now}
end
write_record(KEYS[1], ARGV[1], ARGV[2])
return {0, now}
