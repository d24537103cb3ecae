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

{{- define "ipsetmgr.selectorLabels" -}}
app.kubernetes.io/name: ipsetmgr
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end }}

{{- define "ipsetmgr.labels" -}}
{{ include "ipsetmgr.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{- define "ipsetmgr.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end }}
