-- freshkey: read an entry; on a miss hand out a fill lease (one holder per key at a time).
-- KEYS[1]  entry key
-- ARGV[1]  lease token proposed by the caller (random, unique)
-- ARGV[2]  lease TTL in ms
-- returns {1, version, value}      a live entry
--         {0, token, version}      a miss; the caller holds the lease (version: the tombstone's, or '')
--         {2, '', version}         a miss; another caller holds a valid lease: wait or read through
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'v', 'd', 'tomb', 'l', 'le')
if h[1] and h[2] and not h[3] then
  return {1, h[1], h[2]}
end
if h[4] and h[5] and tonumber(h[5]) > now then
  return {2, '', h[1] or ''}
end
redis.call('HSET', KEYS[1], 'l', ARGV[1], 'le', string.format('%.0f', now + tonumber(ARGV[2])))
if not h[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return {0, ARGV[1], h[1] or ''}
