{{/* Chart name, truncated to 63 characters (the DNS label limit of resource names). */}}
{{- define "rto.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name prefix: the release name, plus the chart name unless the release name already
contains it. Truncated to 63 characters; names built on it add short suffixes and truncate again.
*/}}
{{- define "rto.fullname" -}}
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

{{/* fullname plus a suffix, still at most 63 characters. Usage: include "rto.suffixed" (list . "metrics") */}}
{{- define "rto.suffixed" -}}
{{- $root := index . 0 }}
{{- $suffix := index . 1 }}
{{- $base := include "rto.fullname" $root | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" }}
{{- printf "%s-%s" $base $suffix }}
{{- end }}

{{- define "rto.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rto.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rto.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rto.labels" -}}
helm.sh/chart: {{ include "rto.chart" . }}
{{ include "rto.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: resilient-training-operator
{{- end }}

{{- define "rto.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rto.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rto.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
