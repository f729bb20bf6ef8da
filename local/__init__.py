"""`kubetrain run --local`: a TrainingJob's pods as processes on this machine (plan,
supervision, terminal view, network namespaces, plots). Imports the operator's pure renderer
and gang decision, never kopf or the Kubernetes client."""
