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

{{/*
The operator's ServiceAccount. With serviceAccount.create=false a name is required: falling back to the
namespace's `default` ServiceAccount would hand the operator's ClusterRoles to every pod using it.
*/}}
{{- define "rto.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rto.fullname" .) .Values.serviceAccount.name }}
{{- else if .Values.serviceAccount.name }}
{{- .Values.serviceAccount.name }}
{{- else }}
{{- fail "serviceAccount.name is required when serviceAccount.create=false (the operator's roles are bound to it; the namespace's default ServiceAccount is never used)" }}
{{- end }}
{{- end }}

{{/* repository[:tag][@digest]; the tag may be a number (--set image.tag=20261130). */}}
{{- define "rto.image" -}}
{{- $tag := toString (default .Chart.AppVersion .Values.image.tag) }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
Labels of the uninstall hook's objects (templates/uninstall-hook.yaml). Not the selector labels: the
hook's pod must match no selector of the release (a ReplicaSet would adopt it, a Service route to it).
*/}}
{{- define "rto.uninstallLabels" -}}
helm.sh/chart: {{ include "rto.chart" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: resilient-training-operator
app.kubernetes.io/component: uninstall-cleanup
{{- end }}

{{/* The uninstall hook's annotations; the argument is its weight (RBAC before the Job). */}}
{{- define "rto.uninstallHook" -}}
helm.sh/hook: post-delete
helm.sh/hook-weight: {{ . | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end }}
