-- freshkey: write an entry only if its version is newer than what the key holds (entry or tombstone).
-- A write that lands voids any outstanding fill lease on the key and is broadcast to in-process tiers.
-- KEYS[1]  entry key
-- KEYS[2]  (optional) the namespace's signature key '<prefix>:{<namespace>}:$signature'
-- ARGV[1]  version (unsigned decimal integer, no leading zeros)
-- ARGV[2]  value (JSON bytes)
-- ARGV[3]  commit time, microseconds since the epoch
-- ARGV[4]  TTL in ms, '0' for none
-- ARGV[5]  invalidation channel ('' for none); message: 'w <version> <key>'
-- ARGV[6]  (optional) signature the entry was built under ('' or absent: none), stored in field 's'
-- ARGV[7]  (optional) row key of the row it was built from ('' or absent: none), stored in field 'k'
-- With KEYS[2], an entry of the same version but another signature is replaced when ARGV[6] is the
-- namespace's active or pending signature (a rebuild under a new model; never the other way round).
-- returns {1, previous version or ''} when written, {0, current version} when rejected as stale
--
-- The rule lives in write_if_newer() alone: apply_batch.lua applies many actions with this very
-- function (cache_writer/redis/tier.py puts it in front of the batch loop).
local function write_if_newer(key, sig_key, version, value, commit_us, ttl, channel, sig, row)
  local cur = redis.call('HGET', key, 'v')
  if cur and not gt(version, cur) then
    if not sig_key or sig == '' or cur ~= version then
      return {0, cur}
    end
    local h = redis.call('HMGET', key, 'tomb', 's')
    if h[1] or h[2] == sig then
      return {0, cur}
    end
    local a = redis.call('HMGET', sig_key, 's', 'ps')
    if sig ~= a[1] and sig ~= a[2] then
      return {0, cur}
    end
  end
  set_entry(key, {'v', version, 'd', value, 'c', commit_us}, sig, row, ttl)
  if channel ~= '' then
    redis.call('PUBLISH', channel, 'w ' .. version .. ' ' .. key)
  end
  return {1, cur or ''}
end
-- @single: one action, as documented above
return write_if_newer(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6] or '', ARGV[7] or '')
