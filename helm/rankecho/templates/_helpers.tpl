{{/* Chart name, overridable. */}}
{{- define "rankecho.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-qualified name used as the prefix of every object. */}}
{{- define "rankecho.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "rankecho.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "rankecho.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "rankecho.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "rankecho.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels; call with (dict "root" $ "component" "echo"). */}}
{{- define "rankecho.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rankecho.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "rankecho.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "rankecho.secretName" -}}
{{- default (printf "%s-token" (include "rankecho.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "rankecho.echoServiceName" -}}
{{- printf "%s-echo" (include "rankecho.fullname" .) -}}
{{- end -}}

{{/* host:port the agent sends OTLP/gRPC to. */}}
{{- define "rankecho.agentEndpoint" -}}
{{- if .Values.agent.endpoint -}}
{{- .Values.agent.endpoint -}}
{{- else if .Values.echo.enabled -}}
{{- printf "%s.%s.svc:%v" (include "rankecho.echoServiceName" .) .Release.Namespace .Values.echo.ports.otlpGrpc -}}
{{- else -}}
{{- fail "echo.enabled is false: set agent.endpoint to the host:port of your Echo's OTLP/gRPC listener" -}}
{{- end -}}
{{- end -}}

{{- define "rankecho.clusterId" -}}
{{- required "set clusterId (e.g. --set clusterId=prod-a): the agent stamps it on every event as k8s.cluster.name" .Values.clusterId -}}
{{- end -}}

{{- define "rankecho.tlsDir" -}}/etc/rankecho/tls{{- end -}}

{{/* The RANKECHO_TOKEN env entry shared by Echo and the agent. */}}
{{- define "rankecho.tokenEnv" -}}
- name: RANKECHO_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "rankecho.secretName" . }}
      key: {{ .Values.auth.secretKey }}
{{- end -}}
