-- Compare-and-swap on the whole record (a takeover, or a claim over an expired
-- record): replace it only if it is still exactly ARGV[1] — not merely the same token,
-- so a completion or a heartbeat of that token since it was read makes the swap fail —
-- and the caller's clock (ARGV[6]) is within ARGV[7] ms of this server's.
-- Returns {1, now} if replaced, {0, now} if the record changed, {2, now} if the
-- clocks disagree.
-- KEYS[1] idem:{<record key>}   ARGV: expected record, token, state, record, pexpireat, now, tolerance
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('HGET', KEYS[1], 'r') ~= ARGV[1] then
  return {0, now}
end
if math.abs(now - tonumber(ARGV[6])) > tonumber(ARGV[7]) then
  return {2, now}
end
redis.call('HSET', KEYS[1], 't', ARGV[2], 's', ARGV[3], 'r', ARGV[4])
redis.call('PEXPIREAT', KEYS[1], ARGV[5])
return {1, now}
