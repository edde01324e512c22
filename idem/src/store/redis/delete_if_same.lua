-- A purge: deletes the record only if it is still exactly ARGV[1] (the core's encoding
-- of what the purge decision read), and announces its record key ARGV[3] on the purge
-- channel ARGV[2] in the same step. Returns 1 when deleted, 0 when not.
-- KEYS[1] idem:{<record key>}
if redis.call('HGET', KEYS[1], 'r') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
