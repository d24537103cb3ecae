{{/*
Helpers. tests/manifests/ renders this chart with real Helm and checks the
objects; tests/chart_server.rs lints it (helm lint --strict) and applies it
to a real API server.
*/}}

{{/* Object name: the release name unless fullnameOverride is set. */}}
{{- define "ipsetmgr.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/*
The agent's ServiceAccount, ClusterRole and binding. (The DaemonSet itself
keeps the plain fullname, as in 0.1: see daemonset.yaml.)
*/}}
{{- define "ipsetmgr.agentName" -}}
{{ include "ipsetmgr.fullname" . }}-agent
{{- end }}

{{/*
The controller's Deployment, ServiceAccount, roles and bindings.
*/}}
{{- define "ipsetmgr.controllerName" -}}
{{ include "ipsetmgr.fullname" . }}-controller
{{- end }}

{{/* Labels of every object of the release, whatever its component. */}}
{{- define "ipsetmgr.commonLabels" -}}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{/*
The agent pods' selector. It must stay as it was in 0.1: a DaemonSet's
selector is immutable, so a changed one would fail `helm upgrade`.
*/}}
{{/* Labels of an object of the release that belongs to no one component. */}}
{{- define "ipsetmgr.labels" -}}
app.kubernetes.io/name: ipsetmgr
app.kubernetes.io/instance: {{ .Release.Name }}
{{ include "ipsetmgr.commonLabels" . }}
{{- end }}

{{- define "ipsetmgr.agent.selectorLabels" -}}
app.kubernetes.io/name: ipsetmgr
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end }}

{{- define "ipsetmgr.agent.labels" -}}
{{ include "ipsetmgr.agent.selectorLabels" . }}
{{ include "ipsetmgr.commonLabels" . }}
{{- end }}

{{- define "ipsetmgr.controller.selectorLabels" -}}
app.kubernetes.io/name: ipsetmgr
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "ipsetmgr.controller.labels" -}}
{{ include "ipsetmgr.controller.selectorLabels" . }}
{{ include "ipsetmgr.commonLabels" . }}
{{- end }}

{{/* One image for both components (the controller overrides its command). */}}
{{- define "ipsetmgr.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/*
A listener's address for the binary's --listen/--health-listen
(IPSETMGR_LISTEN, IPSETMGR_HEALTH_LISTEN): "<address>:<port>". The argument
is a {address, port} map of values. IPv4 only (values.schema.json allows
nothing else): an IPv6 address would need brackets.
*/}}
{{- define "ipsetmgr.listen" -}}
{{ .address }}:{{ .port }}
{{- end }}

{{/*
The metrics and health listeners of one component (the argument holds its
`metrics` and `health` values). On one port they must share the address: the
binary then serves every path on one listener, while the same port on two
addresses cannot both be bound (the second bind fails at start). Ports are
compared as strings: Helm holds a number from a values file as float64 and one
from --set as int64, and eq fails on the two.
*/}}
{{- define "ipsetmgr.checkListeners" -}}
{{- if eq (toString .metrics.port) (toString .health.port) }}
{{- if ne .metrics.address .health.address }}
{{- fail "metrics.port and health.port are equal but their addresses differ: one port can be bound on one address only. Give both the same address (one listener then serves every path) or health another port." }}
{{- end }}
{{- end }}
{{- end }}

{{/* A probe's timing fields, from a livenessProbe/readinessProbe value. */}}
{{- define "ipsetmgr.probeTiming" -}}
initialDelaySeconds: {{ .initialDelaySeconds }}
periodSeconds: {{ .periodSeconds }}
timeoutSeconds: {{ .timeoutSeconds }}
failureThreshold: {{ .failureThreshold }}
{{- end }}

{{/*
Whether to render the ServiceMonitors and their Services, and the
PrometheusRule: "true" or "". Each needs its `enabled`, and either the
cluster serving its kind (so that a missing monitoring stack does not fail an
install of node infrastructure) or its `force` (helm template without
--api-versions, a CRD installed in the same run). NOTES.txt says when an
enabled one was left out.
*/}}
{{- define "ipsetmgr.serviceMonitor.render" -}}
{{- if and .Values.serviceMonitor.enabled (or .Values.serviceMonitor.force (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor")) -}}
true
{{- end -}}
{{- end }}

{{- define "ipsetmgr.prometheusRule.render" -}}
{{- if and .Values.prometheusRule.enabled (or .Values.prometheusRule.force (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule")) -}}
true
{{- end -}}
{{- end }}
