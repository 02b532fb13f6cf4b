"""Engine metrics: the step record (`stats`), Prometheus export (`prometheus`), the dashboard's
feed (`live`) and the doctor's reading of them (`doctor`)."""
