-- Copy the authority's record into Redis unless Redis already holds a newer one:
-- idem_core::Record::supersedes — (token, phase) never moves backwards.
-- Returns 1 if written, else 0.
-- KEYS[1] idem:{<record key>}   ARGV: record, pexpireat
local cur = read_record(KEYS[1])
if cur and older(ARGV[1], cur) then
  return 0
end
write_record(KEYS[1], ARGV[1], ARGV[2])
return 1
