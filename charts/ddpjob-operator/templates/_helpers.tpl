{{- define "ddpjob.name" -}}ddpjob-operator{{- end -}}

{{- define "ddpjob.fullname" -}}
{{- $name := .Release.Name -}}
{{- if not (contains "ddpjob" $name) -}}{{- $name = printf "%s-ddpjob" $name -}}{{- end -}}
{{- if not (hasSuffix "operator" $name) -}}{{- $name = printf "%s-operator" $name -}}{{- end -}}
{{- $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ddpjob.labels" -}}
app.kubernetes.io/name: {{ include "ddpjob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ddpjob
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "ddpjob.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ddpjob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ddpjob.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "ddpjob.fullname" .) .Values.serviceAccount.name }}
{{- else -}}{{ default "default" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}

{{- /* checkReferences.namespaces as a JSON list; an older chart's boolean (plain --reuse-values keeps its
default, true) grants nothing: NOTES.txt says so */ -}}
{{- define "ddpjob.referenceNamespaces" -}}
{{- $check := .Values.checkReferences -}}
{{- if kindIs "map" $check -}}
{{- toJson ($check.namespaces | default list) -}}
{{- else -}}
[]
{{- end -}}
{{- end -}}
