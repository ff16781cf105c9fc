-- freshkey prelude: put in front of every script by cache_writer/redis/scripts.py (one copy of the rules
-- several scripts share).
-- gt(a, b): whether version a is greater than version b (unsigned decimal strings, no leading zeros).
local function gt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
-- now_ms(): the server's clock in ms since the epoch (leases are timed by the server, never a client).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- set_entry(key, fields, sig, row, ttl): write the entry's fields, set or drop its signature 's' and
-- row key 'k', drop a tombstone and any fill lease, then set its TTL in ms ('0': none). Fields are set
-- first and dropped after: the key never vanishes mid-script (a Redis Cluster slot migration would
-- refuse the rest of the script as a "non local key").
local function set_entry(key, fields, sig, row, ttl)
  local gone = {'tomb', 'l', 'le'}
  if sig ~= '' then
    fields[#fields + 1] = 's'; fields[#fields + 1] = sig
  else
    gone[#gone + 1] = 's'
  end
  if row ~= '' then
    fields[#fields + 1] = 'k'; fields[#fields + 1] = row
  else
    gone[#gone + 1] = 'k'
  end
  redis.call('HSET', key, unpack(fields))
  redis.call('HDEL', key, unpack(gone))
  if ttl ~= '0' then
    redis.call('PEXPIRE', key, ttl)
  else
    redis.call('PERSIST', key)
  end
end
