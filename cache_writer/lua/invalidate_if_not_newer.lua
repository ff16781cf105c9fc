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
--
-- The rule lives in invalidate_if_not_newer() alone: apply_batch.lua applies many actions with this
-- very function (cache_writer/redis/tier.py puts it in front of the batch loop).
local function invalidate_if_not_newer(key, version, commit_us, ttl, channel)
  local cur = redis.call('HGET', key, 'v')
  if cur and (gt(cur, version) or (cur == version and redis.call('HEXISTS', key, 'tomb') == 1)) then
    -- Nothing to replace, but the row changed around this version: a fill lease issued before this
    -- invalidation may carry what a reader read before it, so it is void all the same.
    redis.call('HDEL', key, 'l', 'le')
    return {0, cur}
  end
  -- Tombstone first, then drop every other field (value, lease): the key must never vanish mid-script,
  -- or a Redis Cluster slot migration refuses the rest of the script (a non-local key).
  redis.call('HSET', key, 'v', version, 'tomb', '1', 'c', commit_us)
  for _, field in ipairs(redis.call('HKEYS', key)) do
    if field ~= 'v' and field ~= 'tomb' and field ~= 'c' then
      redis.call('HDEL', key, field)
    end
  end
  redis.call('PEXPIRE', key, ttl)
  if channel ~= '' then
    redis.call('PUBLISH', channel, 'i ' .. version .. ' ' .. key)
  end
  return {1, cur or ''}
end
-- @single: one action, as documented above
return invalidate_if_not_newer(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
