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

{{/* repository@digest when image.digest is set (what was pushed, immutably), else repository:tag. */}}
{{- define "rankecho.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
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


{{/*
The token of the chart-made Secret, resolved once per render (secret.yaml and the pods' checksum both
include it): auth.token; else the token already in the cluster's Secret (kept on every upgrade); else a
new random one, minted only when the cluster answers (helm install). A render without a cluster (helm
template, Argo CD and other GitOps tools, a client-side --dry-run) cannot see the Secret and would mint a
different token every time, leaving Echo and the agents with different tokens: it fails and names the fix.
*/}}
{{- define "rankecho.token" -}}
{{- if not (hasKey . "rankechoToken") -}}
{{- $token := .Values.auth.token -}}
{{- if not $token -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "rankecho.secretName" .) -}}
{{- if $existing -}}
{{- $token = index ($existing.data | default dict) .Values.auth.secretKey | default "" | b64dec -}}
{{- end -}}
{{- end -}}
{{- if not $token -}}
{{- if lookup "v1" "ConfigMap" .Release.Namespace "" -}}
{{- $token = randAlphaNum 48 -}}
{{- else -}}
{{- fail "auth: this render has no cluster to keep a generated token in (helm template, GitOps and client-side --dry-run would mint a new one each time): create a Secret once (kubectl -n NAMESPACE create secret generic rankecho-token --from-literal=token=$(openssl rand -hex 24)) and set auth.existingSecret=rankecho-token, or set auth.token" -}}
{{- end -}}
{{- end -}}
{{- $_ := set . "rankechoToken" $token -}}
{{- end -}}
{{- index . "rankechoToken" -}}
{{- end -}}

{{/*
Annotation value on both pod templates: changes whenever the token does, so Echo and every agent restart
together onto the new token. For auth.existingSecret it hashes the Secret's current data where the cluster
answers (a rotated Secret restarts the pods on the next helm upgrade), else only its name and key.
*/}}
{{- define "rankecho.tokenChecksum" -}}
{{- if .Values.auth.existingSecret -}}
{{- $secret := lookup "v1" "Secret" .Release.Namespace .Values.auth.existingSecret | default dict -}}
{{- $data := index ($secret.data | default dict) .Values.auth.secretKey | default "" -}}
{{- printf "%s/%s/%s" .Values.auth.existingSecret .Values.auth.secretKey $data | sha256sum -}}
{{- else -}}
{{- include "rankecho.token" . | sha256sum -}}
{{- end -}}
{{- end -}}
