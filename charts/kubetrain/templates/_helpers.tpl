{{/* Chart name, overridable. */}}
{{- define "kubetrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-<chart>, or the release name alone when it already contains the chart
name. Truncated to 63 characters because some Kubernetes name fields are DNS labels.
*/}}
{{- define "kubetrain.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kubetrain.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "kubetrain.labels" -}}
helm.sh/chart: {{ include "kubetrain.chart" . }}
{{ include "kubetrain.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kubetrain
{{- end }}

{{/* Selector labels: immutable on a Deployment, so nothing version-dependent here. */}}
{{- define "kubetrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubetrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "kubetrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kubetrain.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image: a digest pins it, else the tag, else the chart's appVersion. */}}
{{- define "kubetrain.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The operator's configuration, passed as the environment variables that `kubetrain operator` reads
(cli/main.py: each flag has a KUBETRAIN_* envvar). What the chart itself needs to know (the
namespaces its RBAC covers, the ports its probes and Service use, whether to elect a leader and
on which Lease) is always passed; the operator's tunables only when set (values.yaml, `operator`).
*/}}
{{- define "kubetrain.operatorEnv" -}}
- name: KUBETRAIN_AGENT_KEY
  valueFrom:
    secretKeyRef:
      name: {{ printf "%s-agent-key" (include "kubetrain.fullname" .) }}
      key: key
- name: KUBETRAIN_WATCH_NAMESPACES
  value: {{ join "," .Values.operator.watchNamespaces | quote }}
- name: KUBETRAIN_METRICS_PORT
  value: {{ ternary (toString .Values.metrics.port) "0" .Values.metrics.enabled | quote }}
- name: KUBETRAIN_HEALTH_PORT
  value: {{ .Values.health.port | quote }}
{{- /* The runtime's init container runs this chart's operator image unless told otherwise; empty: none. */}}
- name: KUBETRAIN_RUNTIME_IMAGE
  value: {{ ternary (default (include "kubetrain.image" .) .Values.operator.runtimeImage) "" .Values.operator.injectRuntime | quote }}
- name: KUBETRAIN_LEADER_ELECT
  value: {{ .Values.leaderElection.enabled | quote }}
{{- if .Values.leaderElection.enabled }}
- name: KUBETRAIN_LEASE_NAME
  value: {{ include "kubetrain.fullname" . | quote }}
- name: KUBETRAIN_LEASE_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}
{{- range $name, $value := dict
    "KUBETRAIN_TRAINER_IMAGE" .Values.operator.trainerImage
    "KUBETRAIN_CLUSTER_DOMAIN" .Values.operator.clusterDomain
    "KUBETRAIN_LOG_LEVEL" .Values.operator.logLevel
    "KUBETRAIN_LOG_FORMAT" .Values.operator.logFormat
    "KUBETRAIN_STUCK_TIMEOUT_SECONDS" .Values.operator.stuckTimeoutSeconds
    "KUBETRAIN_PROGRESS_INTERVAL_SECONDS" .Values.operator.progressIntervalSeconds
    "KUBETRAIN_LEASE_DURATION_SECONDS" .Values.leaderElection.leaseDurationSeconds
    "KUBETRAIN_LEASE_RENEW_DEADLINE_SECONDS" .Values.leaderElection.renewDeadlineSeconds
    "KUBETRAIN_LEASE_RETRY_PERIOD_SECONDS" .Values.leaderElection.retryPeriodSeconds
}}
{{- if not (kindIs "invalid" $value) }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}
{{- end }}
