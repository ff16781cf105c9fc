-- freshkey: read an entry; on a miss hand out a fill lease (one holder per key at a time).
-- KEYS[1]  entry key
-- KEYS[2]  (optional) the namespace's signature key '<prefix>:{<namespace>}:$signature'
-- ARGV[1]  lease token proposed by the caller (random, unique)
-- ARGV[2]  lease TTL in ms
-- With KEYS[2], an entry is live only if its signature (field 's', '' when absent) is the namespace's
-- active one (field 's' of KEYS[2], '' when absent): an entry built under another signature is a miss
-- (invariant 7). The active signature is returned so that a fill can be made under it.
-- returns {1, version, value, signature, fo}   a live entry
--         {0, token, version, signature, fo}   a miss; the caller holds the lease (version: the entry's
--                                              or tombstone's, or '')
--         {2, '', version, signature, fo}      a miss; another caller holds a valid lease: wait or read
--                                              through
-- fo: '' normally; the ms since which an outer tier (L3...) is fenced: do not read it now.
local now = now_ms()
local active = ''
local fo = ''
if KEYS[2] then
  local sig = redis.call('HMGET', KEYS[2], 's', 'fo')
  active = sig[1] or ''
  fo = sig[2] or ''
end
local h = redis.call('HMGET', KEYS[1], 'v', 'd', 'tomb', 'l', 'le', 's')
if h[1] and h[2] and not h[3] and (not KEYS[2] or (h[6] or '') == active) then
  return {1, h[1], h[2], active, fo}
end
if h[4] and h[5] and tonumber(h[5]) > now then
  return {2, '', h[1] or '', active, fo}
end
redis.call('HSET', KEYS[1], 'l', ARGV[1], 'le', string.format('%.0f', now + tonumber(ARGV[2])))
if not h[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return {0, ARGV[1], h[1] or '', active, fo}
