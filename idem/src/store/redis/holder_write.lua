-- A holder's write (heartbeat, complete, release), under idem_core::Holder::check's
-- precondition: the record is in progress (state 0), still carries the holder's
-- token (ARGV[1], 8 bytes big-endian), is not a released claim (whatever the clocks:
-- a heartbeat landing after its holder's release renews nothing) and has not expired;
-- and the caller's clock (ARGV[4]) is within ARGV[5] ms
-- of this server's.
-- Returns {1, now} when written, {0, now, current record or nil} when refused (the
-- core says why), {2, now} when the clocks disagree (nothing written).
-- KEYS[1] idem:{<record key>}   ARGV: holder token, record, pexpireat, now, tolerance
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cur = read_record(KEYS[1])
if cur and state_of(cur) == 0 and token_of(cur) == ARGV[1] and not released(cur)
    and now < expires_of_claim(cur) then
  if math.abs(now - tonumber(ARGV[4])) > tonumber(ARGV[5]) then
    return {2, now}
  end
  write_record(KEYS[1], ARGV[2], ARGV[3])
  return {1, now}
end
return {0, now, cur}
