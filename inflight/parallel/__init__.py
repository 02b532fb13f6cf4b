"""Tensor parallelism: one model split over ranks (Megatron's split, as vLLM does it).

`shard.py` says which slice of every weight a rank holds; `group.py` is the ranks' collectives
(`shm.py`'s all-reduce through shared memory, gloo beside it); `workers.py` starts ranks 1..N-1
(as processes, or as Ray actors across nodes: `ray_ranks.py`) and hands them each step, while
rank 0 runs the engine: scheduler, sampling and its own slice of the model.
"""
