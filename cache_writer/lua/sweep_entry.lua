-- freshkey: delete an entry built under a signature that is neither the namespace's active nor its
-- pending one (an old model's entry: never served again). Tombstones are kept (they guard versions).
-- KEYS[1]  entry key
-- KEYS[2]  the namespace's signature key '<prefix>:{<namespace>}:$signature'
-- ARGV[1]  '1' to only count
-- returns 1 when the entry is (or would be) deleted, else 0
local h = redis.call('HMGET', KEYS[1], 'v', 'd', 'tomb', 's')
if not h[1] or not h[2] or h[3] then
  return 0
end
local a = redis.call('HMGET', KEYS[2], 's', 'ps')
local sig = h[4] or ''
if sig == (a[1] or '') or (a[2] and sig == a[2]) then
  return 0
end
if ARGV[1] ~= '1' then
  redis.call('DEL', KEYS[1])  -- the last command: nothing runs after the key is gone
end
return 1
