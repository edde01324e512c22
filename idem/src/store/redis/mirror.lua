-- Copy the authority's record into Redis unless Redis already holds a newer one:
-- idem_core::Record::supersedes — (token, state) never moves backwards.
-- Tokens are compared as decimal strings (no leading zeros), exactly, without floats.
-- Returns 1 if written, else 0.
-- KEYS[1] idem:{<record key>}   ARGV: token, state, record, pexpireat
local function older(t1, s1, t2, s2)  -- is (t1, s1) < (t2, s2)?
  if #t1 ~= #t2 then return #t1 < #t2 end
  if t1 ~= t2 then return t1 < t2 end
  return s1 < s2
end
local cur = redis.call('HMGET', KEYS[1], 't', 's')
if cur[1] and older(ARGV[1], ARGV[2], cur[1], cur[2]) then
  return 0
end
redis.call('HSET', KEYS[1], 't', ARGV[1], 's', ARGV[2], 'r', ARGV[3])
redis.call('PEXPIREAT', KEYS[1], ARGV[4])
return 1
