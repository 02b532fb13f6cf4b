"""Engine: the step loop (core), input/output processing and the offline LLM API."""
