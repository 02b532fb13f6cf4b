"""Workloads and their runs, shared by `inflight bench` (the engine and its peers) and
`inflight simulate`: the requests of a workload (`requests`), the records and summary of a run
(`results`), its report and plots (`report`), and the flags that pick one (`flags`)."""
