#!lua flags=allow-oom
-- KEYS[1] tombstones zset
-- A: tombstone_id, selector (JSON), mode, reason, requested_by, cause, ttl_ms
-- A hold on later runs: until it expires, a run started, claimed or queued that matches the
-- selector is recorded cancelled with this request (inherited_cancel).
-- -> {code = ok (expires_at) | full (MAX_TOMBSTONES live already)}; the id laid already (a call
-- sent again) answers ok and changes nothing
local tombstones = KEYS[1]
redis.call('ZREMRANGEBYSCORE', tombstones, '-inf', fmt(NOW_S))
local laid = redis.call('ZSCORE', tombstones, A.tombstone_id)
if laid then return {code = C.OK, expires_at = laid} end  -- sent again: laid, even if now full
if redis.call('ZCARD', tombstones) >= MAX_TOMBSTONES then return {code = C.FULL} end
local expires = fmt(NOW_S + A.ttl_ms / 1000)
local tk = key_tombstone(A.tombstone_id)
redis.call('HSET', tk, T.TOMBSTONE_ID, A.tombstone_id, T.SELECTOR, A.selector, T.MODE, A.mode,
  T.CAUSE, A.cause, T.CREATED_AT, NOW, T.EXPIRES_AT, expires)
if A.reason ~= '' then redis.call('HSET', tk, T.REASON, A.reason) end
if A.requested_by ~= '' then redis.call('HSET', tk, T.REQUESTED_BY, A.requested_by) end
redis.call('PEXPIRE', tk, A.ttl_ms)
redis.call('ZADD', tombstones, expires, A.tombstone_id)
return {code = C.OK, expires_at = expires}
