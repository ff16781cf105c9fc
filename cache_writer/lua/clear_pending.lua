-- freshkey: roll back a cutover that did not finish: drop the pending signature, if it is still ours.
-- KEYS[1]  <prefix>:{<namespace>}:$signature
-- ARGV[1]  the pending signature the cutover wrote
-- returns 1 when it was dropped, 0 when another (or no) signature is pending
if redis.call('HGET', KEYS[1], 'ps') ~= ARGV[1] then
  return 0
end
redis.call('HDEL', KEYS[1], 'ps', 'po', 'pu', 'pcols', 'pt')
return 1
