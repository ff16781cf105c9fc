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
local sig = ARGV[6] or ''
local row = ARGV[7] or ''
local cur = redis.call('HGET', KEYS[1], 'v')
if cur and not gt(ARGV[1], cur) then
  if not KEYS[2] or sig == '' or cur ~= ARGV[1] then
    return {0, cur}
  end
  local h = redis.call('HMGET', KEYS[1], 'tomb', 's')
  if h[1] or h[2] == sig then
    return {0, cur}
  end
  local a = redis.call('HMGET', KEYS[2], 's', 'ps')
  if sig ~= a[1] and sig ~= a[2] then
    return {0, cur}
  end
end
set_entry(KEYS[1], {'v', ARGV[1], 'd', ARGV[2], 'c', ARGV[3]}, sig, row, ARGV[4])
if ARGV[5] ~= '' then
  redis.call('PUBLISH', ARGV[5], 'w ' .. ARGV[1] .. ' ' .. KEYS[1])
end
return {1, cur or ''}
