-- How a record is kept (prefixed to every script): the key's value is the core's
-- encoding of the record (idem_core::Record::encode), a string, and the key expires at
-- the record's delete-after instant. In that encoding byte 1 is the version (1), byte 2
-- the state (0 in progress, 1 completed), bytes 35-42 the token, big-endian.
-- idem 0.1 kept a hash (fields t, s, r): such a record is read here too, and becomes a
-- string at its next write.
local function read_record(key)
  local value = redis.pcall('GET', key)
  if type(value) == 'table' and value.err then
    return redis.call('HGET', key, 'r')
  end
  return value
end
local function write_record(key, record, pexpireat)
  redis.call('SET', key, record)
  redis.call('PEXPIREAT', key, pexpireat)
end
-- Offsets below hold for version 1 only: anything else stops the script, nothing written.
local function checked(record)
  if string.byte(record, 1) ~= 1 or #record < 42 then
    error('idem: a record of an unknown encoding (version ' .. tostring(string.byte(record, 1)) .. ')')
  end
  return record
end
local function state_of(record)
  return string.byte(checked(record), 2)
end
local function token_of(record)
  return string.sub(checked(record), 35, 42)
end
-- Whether record a's (token, state) is below record b's, byte by byte: no floats, and
-- no locale (Lua's own < on strings collates).
local function older(a, b)
  local ta, tb = token_of(a), token_of(b)
  for i = 1, 8 do
    local x, y = string.byte(ta, i), string.byte(tb, i)
    if x ~= y then
      return x < y
    end
  end
  return state_of(a) < state_of(b)
end
