#!lua flags=no-writes
-- KEYS[1] active zset
-- A: selector (see selector_matches), offset, count
-- Read-only: the active runs (queued, running, waiting) among `count` of the active index from
-- `offset` (newest first) that match the selector.
-- -> {code = ok, next (the next offset; -1: the index ends), matched ({run_id...})}
local ids = redis.call('ZRANGE', KEYS[1], A.offset, A.offset + A.count - 1, 'REV')
local matched = {}
for _, id in ipairs(ids) do
  local r = record(id)
  if r[R.STATUS] and ACTIVE[r[R.STATUS]] and selector_matches(A.selector, r) then
    table.insert(matched, id)
  end
end
local next_offset = A.offset + A.count
if #ids < A.count then next_offset = -1 end
return {code = C.OK, next = next_offset, matched = matched}
