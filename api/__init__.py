"""The TrainingJob API shared by every part of kubetrain: the pydantic models (the single
source of the CRD), CRD generation, child naming, the env contract between pods and the
processes in them, and the metrics-record format. Needs pydantic and PyYAML only: no torch,
no kopf, no Kubernetes client."""
