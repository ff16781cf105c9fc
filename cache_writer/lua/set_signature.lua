-- freshkey: move a namespace's active signature forward (compare-and-set on its order), or record the
-- signature a cutover is preparing (pending). A signature never moves backwards (invariant 7's anchor).
-- KEYS[1]  <prefix>:{<namespace>}:$signature
-- ARGV[1]  'active' or 'pending'
-- ARGV[2]  order (schemas.model_updates.signature_order), compared byte by byte, never by locale
-- ARGV[3]  signature (64 lowercase hex digits)
-- ARGV[4]  the model update it comes from (JSON, as on the model-update topic)
-- ARGV[5]  the value columns it covers (JSON array of names)
-- ARGV[6]  now, ms since the epoch (recorded)
-- ARGV[7]  invalidation channel ('' for none); an activation announces 'a <signature> <ARGV[8]>'
-- ARGV[8]  the namespace's key prefix, '<prefix>:{<namespace>}:'
-- returns {1, previous active signature or ''} when set; {0, active order, active signature} when
-- ARGV[2] is not above the active order ('pending': nor at least the pending order).
local function after(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return #a > #b
end
local cur = redis.call('HMGET', KEYS[1], 'o', 's', 'po')
if cur[1] and not after(ARGV[2], cur[1]) then
  return {0, cur[1], cur[2] or ''}
end
if ARGV[1] == 'pending' then
  if cur[3] and after(cur[3], ARGV[2]) then
    return {0, cur[1] or '', cur[2] or ''}
  end
  redis.call('HSET', KEYS[1], 'ps', ARGV[3], 'po', ARGV[2], 'pu', ARGV[4], 'pcols', ARGV[5], 'pt', ARGV[6])
  return {1, cur[2] or ''}
end
redis.call('HSET', KEYS[1], 's', ARGV[3], 'o', ARGV[2], 'u', ARGV[4], 'cols', ARGV[5], 't', ARGV[6])
if cur[3] and not after(cur[3], ARGV[2]) then
  redis.call('HDEL', KEYS[1], 'ps', 'po', 'pu', 'pcols', 'pt')
end
if ARGV[7] ~= '' then
  redis.call('PUBLISH', ARGV[7], 'a ' .. ARGV[3] .. ' ' .. ARGV[8])
end
return {1, cur[2] or ''}
