{{/*
Helpers. The templates of this chart use a deliberately small subset of the
Go-template language (fields, include, if/else, and the functions default,
trunc, trimSuffix, quote, toYaml, nindent), because tests/manifests.rs renders
them without a helm binary. Keep to that subset.
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
