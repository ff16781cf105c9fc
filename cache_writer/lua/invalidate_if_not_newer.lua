-- freshkey: replace an entry with a tombstone unless the key holds a newer version.
-- The tombstone keeps the version for ARGV[3] ms, so a late or replayed older write is rejected. Laying
-- it voids any outstanding fill lease (the fields live in the same hash) and is broadcast to
-- in-process tiers.
-- KEYS[1]  entry key
-- ARGV[1]  version of the delete/invalidation
-- ARGV[2]  commit time, microseconds since the epoch
-- ARGV[3]  tombstone TTL in ms
-- ARGV[4]  invalidation channel ('' for none); message: 'i <version> <key>'
-- returns {1, previous version or ''} when tombstoned, {0, current version} when the key is newer or
-- already holds this very tombstone (a replay). Either way any outstanding fill lease is void.
local cur = redis.call('HGET', KEYS[1], 'v')
if cur and (gt(cur, ARGV[1]) or (cur == ARGV[1] and redis.call('HEXISTS', KEYS[1], 'tomb') == 1)) then
  -- Nothing to replace, but the row changed around this version: a fill lease issued before this
  -- invalidation may carry what a reader read before it, so it is void all the same.
  redis.call('HDEL', KEYS[1], 'l', 'le')
  return {0, cur}
end
-- Tombstone first, then drop every other field (value, lease): the key must never vanish mid-script,
-- or a Redis Cluster slot migration refuses the rest of the script (a non-local key).
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'tomb', '1', 'c', ARGV[2])
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if field ~= 'v' and field ~= 'tomb' and field ~= 'c' then
    redis.call('HDEL', KEYS[1], field)
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if ARGV[4] ~= '' then
  redis.call('PUBLISH', ARGV[4], 'i ' .. ARGV[1] .. ' ' .. KEYS[1])
end
return {1, cur or ''}
