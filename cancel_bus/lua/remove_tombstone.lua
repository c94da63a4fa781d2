#!lua flags=allow-oom
-- KEYS[1] tombstones zset
-- A: tombstone_id, request (unique per call: the hash keeps it for two minutes, so a call
--    redis-py repeats because its answer was lost answers as the first did)
-- -> {code = ok (lifted: true if it was live, and this call lifted it)}
local tk = key_tombstone(A.tombstone_id)
if redis.call('ZREM', KEYS[1], A.tombstone_id) == 0 then
  return {code = C.OK, lifted = redis.call('HGET', tk, T.REMOVED_BY) == A.request}
end
redis.call('DEL', tk)
redis.call('HSET', tk, T.REMOVED_BY, A.request)
redis.call('PEXPIRE', tk, 120000)
return {code = C.OK, lifted = true}
