-- freshkey: an application fill after a miss lands only while its lease is valid: no write or
-- invalidation touched the key since the lease was issued (both remove the lease fields) and it has not
-- expired. This closes the stale-fill race that version checks alone do not (invariant 3).
-- KEYS[1]  entry key
-- KEYS[2]  (optional) the namespace's signature key '<prefix>:{<namespace>}:$signature'
-- ARGV[1]  lease token
-- ARGV[2]  value (JSON bytes)
-- ARGV[3]  version of the row that was read ('' = keep the version the key holds, or 0)
-- ARGV[4]  entry TTL in ms, '0' for none
-- ARGV[5]  (optional) the signature the value was built under: the one get_or_lease returned with the
--          lease ('' or absent: none); with KEYS[2] the fill lands only while it is still the active one
-- ARGV[6]  (optional) row key of the row that was read ('' or absent: none), stored in field 'k'
-- returns {1, version} when filled; {0, 'lease'} when the lease is void or expired;
--         {0, 'stale'} when the key holds a newer version than the row that was read;
--         {0, 'signature'} when the namespace's active signature changed since the lease was issued
local now = now_ms()
local sig = ARGV[5] or ''
local row = ARGV[6] or ''
local h = redis.call('HMGET', KEYS[1], 'v', 'l', 'le')
if h[2] ~= ARGV[1] or not h[3] or tonumber(h[3]) <= now then
  return {0, 'lease'}
end
if KEYS[2] and (redis.call('HGET', KEYS[2], 's') or '') ~= sig then
  return {0, 'signature'}
end
local version = ARGV[3]
if version == '' then
  version = h[1] or '0'
elseif h[1] and gt(h[1], version) then
  return {0, 'stale'}
end
set_entry(KEYS[1], {'v', version, 'd', ARGV[2], 'c', string.format('%.0f', now * 1000)}, sig, row, ARGV[4])
return {1, version}
