-- A purge: deletes the record only if it is still exactly ARGV[1] (the core's encoding
-- of what the purge decision read) and this server's clock has reached ARGV[4] (a live
-- lease's end, judged here), and announces its record key ARGV[3] on the purge channel
-- ARGV[2] in the same step. Returns 1 when deleted, 0 when the record changed, 2 when
-- it is too early. KEYS[1] idem:{<record key>}
if read_record(KEYS[1]) ~= ARGV[1] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now < tonumber(ARGV[4]) then
  return 2
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
