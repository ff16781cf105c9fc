-- freshkey: many writes and invalidations in one call, in order, each exactly as write_if_newer.lua or
-- invalidate_if_not_newer.lua applies it alone: cache_writer/redis/tier.py builds this script from the
-- prelude, the functions of those two scripts and this loop. Every key of one call is in one hash slot
-- (one namespace), so it runs on a Redis Cluster too. An action that fails (a key of another type) is
-- answered with its error and the others go on, as they would in a pipeline of single calls.
-- KEYS     the keys the actions name, in order: an action takes one (its entry key), a write with a
--          signature or a row key takes two (its entry key, then the namespace's signature key)
-- ARGV[1]  JSON array, one element per action, every number as a decimal string:
--          ["w", version, value, commit_us, signature or "", row or "", keys taken (1 or 2)]
--          ["i", version, commit_us]
-- ARGV[2]  TTL of written entries in ms ('0': none)
-- ARGV[3]  TTL of tombstones in ms
-- ARGV[4]  invalidation channel ('' for none)
-- returns  JSON array, one element per action: [1, previous version or ""] applied,
--          [0, current version] refused as not newer, [-1, error] failed
local function failure(e)
  if type(e) == 'table' then
    return e.err or tostring(e)
  end
  return tostring(e)
end
local actions = cjson.decode(ARGV[1])
local out = {}
local k = 1
for i, a in ipairs(actions) do
  local ok, reply
  if a[1] == 'w' then
    local sig_key = nil
    if a[7] == '2' then
      sig_key = KEYS[k + 1]
    end
    ok, reply = pcall(write_if_newer, KEYS[k], sig_key, a[2], a[3], a[4], ARGV[2], ARGV[4], a[5], a[6])
    k = k + tonumber(a[7])
  else
    ok, reply = pcall(invalidate_if_not_newer, KEYS[k], a[2], a[3], ARGV[3], ARGV[4])
    k = k + 1
  end
  if ok then
    out[i] = reply
  else
    out[i] = {-1, failure(reply)}
  end
end
return cjson.encode(out)
