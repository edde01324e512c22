-- Compare-and-swap on the whole record (a takeover, or a claim over an expired
-- record): replace it only if it is still exactly ARGV[1] — not merely the same token,
-- so a completion or a heartbeat of that token since it was read makes the swap fail —
-- and the caller's clock (ARGV[4]) is within ARGV[5] ms of this server's.
-- Returns {1, now} if replaced, {0, now} if the record changed, {2, now} if the
-- clocks disagree.
-- KEYS[1] idem:{<record key>}   ARGV: expected record, record, pexpireat, now, tolerance
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if read_record(KEYS[1]) ~= ARGV[1] then
  return {0, now}
end
if math.abs(now - tonumber(ARGV[4])) > tonumber(ARGV[5]) then
  return {2, now}
end
write_record(KEYS[1], ARGV[2], ARGV[3])
return {1, now}
