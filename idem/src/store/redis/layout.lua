-- How a record is kept (each script is sent with the functions below that it calls,
-- `lua.rs`): the key's value is the core's encoding of the record
-- (idem_core::Record::encode), a string, and the key expires at the record's
-- delete-after instant. In that encoding byte 1 is the version (1), byte 2 the state
-- (0 in progress, 1 completed), bytes 35-42 the token, big-endian. idem 0.1 kept a hash
-- (fields t, s, r): such a record is read here too, and written so by the scripts of
-- the hash layout (--redis-layout hash, for a rolling upgrade from 0.1, whose replicas
-- can't read strings).
local function read_record(key)
  local value = redis.pcall('GET', key)
  if type(value) == 'table' and value.err then
    if string.sub(value.err, 1, 9) ~= 'WRONGTYPE' then
      error(value.err)
    end
    return redis.call('HGET', key, 'r')
  end
  return value
end
-- Offsets below hold for version 1 only: anything else stops the script, nothing written.
local function checked(record)
  if string.byte(record, 1) ~= 1 or #record < 42 then
    error('idem: a record of an unknown encoding (' .. #record .. ' bytes, version ' .. tostring(string.byte(record, 1) or 'none') .. ')')
  end
  return record
end
local function state_of(record)
  return string.byte(checked(record), 2)
end
local function token_of(record)
  return string.sub(checked(record), 35, 42)
end
-- An in-progress record's expiry (ms, bytes 51-58 after its lease, 43-50); exact as a
-- Lua number while below 2^53.
local function expires_of_claim(record)
  if #record < 58 then
    error('idem: an in-progress record of ' .. #record .. ' bytes')
  end
  local n = 0
  for i = 51, 58 do
    n = n * 256 + string.byte(record, i)
  end
  return n
end
-- The token in decimal, as idem 0.1's hashes hold it. Exact: tokens stay below 2^53
-- (milliseconds × 1024) until the year 2248, and larger ones are refused.
local function token_decimal(record)
  local t = token_of(record)
  local n = 0
  for i = 1, 8 do
    n = n * 256 + string.byte(t, i)
  end
  if n >= 9007199254740992 then
    error('idem: a token beyond 2^53 cannot be written as a hash')
  end
  return string.format('%.0f', n)
end
-- [string layout] The record as a string.
local function write_record(key, record, pexpireat)
  redis.call('SET', key, record)
  redis.call('PEXPIREAT', key, pexpireat)
end
-- [hash layout] The record as idem 0.1's hash.
local function write_record(key, record, pexpireat)
  redis.call('DEL', key)
  redis.call('HSET', key, 't', token_decimal(record), 's', tostring(state_of(record)), 'r', record)
  redis.call('PEXPIREAT', key, pexpireat)
end
-- Whether an in-progress record is a released claim: its lease (bytes 43-50) and its
-- expiry (51-58) one instant (idem_core::Record::is_released).
local function released(record)
  return state_of(record) == 0 and string.sub(record, 43, 50) == string.sub(record, 51, 58)
end
-- Claimed (0), released (1), completed (2): a token's records only move forward.
local function phase_of(record)
  if state_of(record) == 1 then
    return 2
  elseif released(record) then
    return 1
  end
  return 0
end
-- Whether record a's (token, phase) is below record b's, byte by byte: no floats, and
-- no locale (Lua's own < on strings collates). idem_core::Record::supersedes.
local function older(a, b)
  local ta, tb = token_of(a), token_of(b)
  for i = 1, 8 do
    local x, y = string.byte(ta, i), string.byte(tb, i)
    if x ~= y then
      return x < y
    end
  end
  return phase_of(a) < phase_of(b)
end
