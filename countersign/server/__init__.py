"""The one HTTP server, for two sides, each module named for its own:

- the requesters' door (people who ask, and API tokens acting for them): `door` (the conversation
  API's routes, /api/conversations…), `requesters` (what each request does: who calls, whose
  conversation, how much, the proof, the record), `conversation_events` (a conversation's events
  stream), `chat` (what the /chat page reads besides);
- the reviewers' inbox: `inbox_routes` (their routes, /api/approvals…), `inbox` (what they do: the
  approvals a reviewer may decide, decisions turned into proofs), `watcher` (their live view);
- shared: `app` (the server put together: sign-in, the middleware, the pages), `http` (the one
  refusal type, strict bodies, who is signed in), `admission` (every API request takes from its
  caller's rate-limit buckets), `headers` (the security headers of every answer), `auth`,
  `sessions`, `throttle` and `oidc` (sign-in and its sessions), `agent_tools` and `drafts`
  (admins' tools, people's drafts).
"""
