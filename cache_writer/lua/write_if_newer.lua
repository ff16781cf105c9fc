-- freshkey: write an entry only if its version is newer than what the key holds (entry or tombstone).
-- A write that lands voids any outstanding fill lease on the key and is broadcast to in-process tiers.
-- KEYS[1]  entry key
-- ARGV[1]  version (unsigned decimal integer, no leading zeros)
-- ARGV[2]  value (JSON bytes)
-- ARGV[3]  commit time, microseconds since the epoch
-- ARGV[4]  TTL in ms, '0' for none
-- ARGV[5]  invalidation channel ('' for none); message: 'w <version> <key>'
-- returns {1, previous version or ''} when written, {0, current version} when rejected as stale
local function gt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
local cur = redis.call('HGET', KEYS[1], 'v')
if cur and not gt(ARGV[1], cur) then
  return {0, cur}
end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'd', ARGV[2], 'c', ARGV[3])
redis.call('HDEL', KEYS[1], 'tomb', 'l', 'le')
if ARGV[4] ~= '0' then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
else
  redis.call('PERSIST', KEYS[1])
end
if ARGV[5] ~= '' then
  redis.call('PUBLISH', ARGV[5], 'w ' .. ARGV[1] .. ' ' .. KEYS[1])
end
return {1, cur or ''}
