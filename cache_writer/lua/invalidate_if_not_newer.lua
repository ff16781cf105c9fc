-- freshkey: replace an entry with a tombstone unless the key holds a newer version.
-- The tombstone keeps the version for ARGV[3] ms, so a late or replayed older write is rejected.
-- KEYS[1]  entry key
-- ARGV[1]  version of the delete/invalidation
-- ARGV[2]  commit time, microseconds since the epoch
-- ARGV[3]  tombstone TTL in ms
-- returns {1, previous version or ''} when tombstoned, {0, current version} when the key is newer or
-- already holds this very tombstone (a replay)
local function gt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
local cur = redis.call('HGET', KEYS[1], 'v')
if cur and (gt(cur, ARGV[1]) or (cur == ARGV[1] and redis.call('HEXISTS', KEYS[1], 'tomb') == 1)) then
  return {0, cur}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'tomb', '1', 'c', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, cur or ''}
