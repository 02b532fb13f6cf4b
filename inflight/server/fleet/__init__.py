"""`inflight serve --replicas N`: N engines as one Ray Serve application behind the same routes.

- `gateway.py`: the gateway (one Serve replica, the HTTP ingress) runs inflight's FastAPI app
  over a `RemoteEngine`: it validates and tokenizes every request itself (a tokenizer, no
  weights), so bad input is a 400 before any engine sees it, and keys each request by its
  leading KV blocks.
- `replica.py`: the engines (`EngineReplica`, N Serve replicas) each run an `AsyncLLM` with its
  share of the cores and of the KV budget, and stream `RequestOutput`s back.
- `router.py`: Ray Serve sends each call to an engine through `InflightRouter`, its
  request-router extension point, which applies `inflight.routing`'s policy to the request's
  prefix key and the engines' loads.
- `hub.py`: every engine pushes its `/metrics` text to the `MetricsHub` actor once a second; the
  gateway's `/metrics` merges them with a `replica` label and adds the router's counters, and
  `/health` fails only when no engine has reported recently.
- `deploy.py`: starts Ray (or joins a cluster) and deploys the gateway and the engines.

When an engine dies, Ray Serve starts a new one; requests it was serving end with an error (an
error chunk on a stream), and the router sends new ones elsewhere.
"""
