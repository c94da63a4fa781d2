#!lua flags=allow-oom
-- KEYS[1] the run's hash, or the session key when A.target starts with 'session:'
-- A: target ('run:<id>' or 'session:<app>:<user>:<session>'), run_id ('' for a session), mode,
--    reason, requested_by, waiter (the node to ring at the end; '': none), caller (the node
--    asking), retention_ms, pub, cause (who asked: user | client_disconnect | node_shutdown |
--    parent), tree (its descendants too), request (unique per call; a call redis-py repeats
--    because its answer was lost finds the run its first run reached and answers for it — and
--    its tree — as they now stand: stopping while active, else how it ended)
-- The target's run, and with `tree` every run started below it (cause 'parent'), deepest first:
-- each as cancel_one does it. A session's cancel also cancels the runs queued behind its active
-- run (multitask strategy 'enqueue'), first, with the same cause: they answer among `below`. The owner is told on its channel, in a message bound to it (its
-- node id and epoch) and to the run — not when the caller is the owner: it sets the token itself.
-- -> {code = not_found | recovering (not found, but Redis lost data lately: ask again)
--    | already_finished | cancelled | owner_lost | stopping, run, receivers (-1: none was
--    published here), below ({{run_id, code, run, receivers}...}: the descendants),
--    truncated (descendants were left out)}
local target_key = KEYS[1]
local run_id = A.run_id
local request_key = key_cancel_request(A.request)
local function answer(a, below, cut)
  a.below, a.truncated = below, cut
  return a
end
local function tree_of(id, act)
  local below, cut = {}, false
  if A.tree then
    local kids
    kids, cut = descendants(id)
    for _, kid in ipairs(kids) do
      local a = act(kid)
      a.run_id = kid
      table.insert(below, a)
    end
  end
  return below, cut
end
local reached = redis.call('GET', request_key)
if reached then  -- this very call ran before: its answer was lost, redis-py sent it again
  if reached == '-' then return {code = C.NOT_FOUND} end
  local below, cut = tree_of(reached, standing)
  return answer(standing(reached), below, cut)
end
local function remember(id)
  redis.call('SET', request_key, id, 'PX', math.min(REQUEST_MEMORY_MS, A.retention_ms))
end
local function not_found()
  -- Redis lost the namespace's data lately (the caller's own record is gone, or a node
  -- re-registered after a loss less than a lease ago): the run may be one its owner has not
  -- re-asserted yet, so the caller asks again rather than be told it does not exist
  if redis.call('EXISTS', key_node(A.caller)) == 0 or
      redis.call('EXISTS', key_recovering()) == 1 then
    return {code = C.RECOVERING}
  end
  remember('-')
  return {code = C.NOT_FOUND}
end
local by_session = string.sub(A.target, 1, #SESSION_PREFIX) == SESSION_PREFIX
if by_session then
  run_id = redis.call('GET', target_key)
  if not run_id then return not_found() end
end
local st = redis.call('HGET', key_run(run_id), R.STATUS)
if (not st) or (by_session and not ACTIVE[st]) then  -- a session has no *active* run
  return not_found()
end
remember(run_id)
local queued = {}
if by_session then
  local s = redis.call('HMGET', key_run(run_id), R.APP_NAME, R.USER_ID, R.SESSION_ID)
  for _, id in ipairs(redis.call('ZRANGE', key_session_queue(s[1], s[2], s[3]), 0, -1)) do
    local a = cancel_one(id, RUN_PREFIX .. id, A.mode, A.reason, A.requested_by, A.cause,
      A.waiter, A.caller, A.retention_ms, A.pub, A.traceparent)
    a.run_id = id
    table.insert(queued, a)
  end
end
local below, cut = tree_of(run_id, function(kid)
  return cancel_one(kid, RUN_PREFIX .. kid, A.mode, A.reason, A.requested_by, 'parent',
    A.waiter, A.caller, A.retention_ms, A.pub, A.traceparent)
end)
for _, a in ipairs(queued) do table.insert(below, a) end
local a = cancel_one(run_id, A.target, A.mode, A.reason, A.requested_by, A.cause, A.waiter,
  A.caller, A.retention_ms, A.pub, A.traceparent)
return answer(a, below, cut)
