"""`inflight simulate`: the real scheduler over a roofline cost model."""
