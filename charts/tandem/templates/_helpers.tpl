{{/* Chart name. */}}
{{- define "tandem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the operator's objects: <release>-operator unless overridden. */}}
{{- define "tandem.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* chart label value */}}
{{- define "tandem.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the operator's pods; never change them on upgrade. */}}
{{- define "tandem.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tandem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The selector labels as `key=value,…` (the operator's --operator-labels). */}}
{{- define "tandem.selectorLabelList" -}}
app.kubernetes.io/name={{ include "tandem.name" . }},app.kubernetes.io/instance={{ .Release.Name }},app.kubernetes.io/component=operator
{{- end }}

{{/* Labels of every object. */}}
{{- define "tandem.labels" -}}
helm.sh/chart: {{ include "tandem.chart" . }}
{{ include "tandem.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "tandem.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tandem.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Image reference. */}}
{{- define "tandem.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Fails the render on value combinations the schema cannot express. */}}
{{- define "tandem.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail "replicaCount > 1 needs leaderElection.enabled: without it every replica would reconcile the same jobs" }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.service.enabled) }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.service.enabled: the ServiceMonitor scrapes that Service" }}
{{- end }}
{{- end }}
