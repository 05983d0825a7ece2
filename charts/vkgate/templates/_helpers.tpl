{{/* Names, labels, and the pieces every workload shares. */}}

{{- define "vkgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* At most 40 characters: resource names add up to 23 more, and a Service name is a DNS
label of at most 63. A release whose name already holds the chart's is not repeated. */}}
{{- define "vkgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "vkgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "vkgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vkgate
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "proxy"). */}}
{{- define "vkgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vkgate.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "vkgate.componentLabels" -}}
{{ include "vkgate.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "vkgate.controlplaneName" -}}
{{- printf "%s-controlplane" (include "vkgate.fullname" .) -}}
{{- end -}}

{{- define "vkgate.proxyName" -}}
{{- printf "%s-proxy" (include "vkgate.fullname" .) -}}
{{- end -}}

{{/* What the proxies call: the release's control-plane Service, by its namespaced name. */}}
{{- define "vkgate.controlplaneURL" -}}
{{- printf "http://%s.%s.svc:%d" (include "vkgate.controlplaneName" .) .Release.Namespace (int .Values.controlplane.service.port) -}}
{{- end -}}

{{- define "vkgate.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "vkgate.fullname" .)) -}}
{{- end -}}

{{- define "vkgate.storesSecretName" -}}
{{- printf "%s-stores" (include "vkgate.fullname" .) -}}
{{- end -}}

{{- define "vkgate.migrateStoresSecretName" -}}
{{- printf "%s-migrate-stores" (include "vkgate.fullname" .) -}}
{{- end -}}

{{- define "vkgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "vkgate.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "vkgate.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* host:port as the services parse it (an IPv6 host in brackets): (list host port). */}}
{{- define "vkgate.listen" -}}
{{- $host := index . 0 -}}
{{- if contains ":" $host -}}
{{- printf "[%s]:%d" $host (int (index . 1)) -}}
{{- else -}}
{{- printf "%s:%d" $host (int (index . 1)) -}}
{{- end -}}
{{- end -}}

{{/* The grace a stopping pod needs: (dict "root" $ "graces" n "override" value). */}}
{{- define "vkgate.terminationGrace" -}}
{{- if not (kindIs "invalid" .override) -}}
{{- .override -}}
{{- else -}}
{{- $grace := int (ceil .root.Values.shutdownGraceSeconds) -}}
{{- add (int .root.Values.preStopSleepSeconds) (mul .graces $grace) 5 -}}
{{- end -}}
{{- end -}}

{{- define "vkgate.podSecurityContext" -}}
runAsNonRoot: true
{{- /* `if not invalid`, not `with`: group 0 is a real choice (OpenShift), not "unset". */}}
{{- $security := .Values.podSecurity }}
{{- if not (kindIs "invalid" $security.runAsUser) }}
runAsUser: {{ $security.runAsUser }}
{{- end }}
{{- if not (kindIs "invalid" $security.runAsGroup) }}
runAsGroup: {{ $security.runAsGroup }}
{{- end }}
{{- if not (kindIs "invalid" $security.fsGroup) }}
fsGroup: {{ $security.fsGroup }}
fsGroupChangePolicy: OnRootMismatch
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "vkgate.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* What every pod spec shares. Service links are off: Kubernetes would otherwise inject
VKGATE_CONTROLPLANE_PORT and the like for the release's own Services, and both services
refuse VKGATE_* variables they do not know. */}}
{{- define "vkgate.podCommon" -}}
enableServiceLinks: false
automountServiceAccountToken: false
serviceAccountName: {{ include "vkgate.serviceAccountName" . }}
securityContext:
  {{- include "vkgate.podSecurityContext" . | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Settings both services read, besides their own. */}}
{{- define "vkgate.commonEnv" -}}
- name: VKGATE_HOME
  value: /var/lib/vkgate
- name: VKGATE_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: VKGATE_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: VKGATE_SHUTDOWN_GRACE_SECONDS
  value: {{ .Values.shutdownGraceSeconds | toString | quote }}
{{- end -}}

{{/* One of the chart's shared secrets: (dict "root" $ "name" "VKGATE_JWT_SECRET"). A
rotation's previous value (`"rotation" true`) is in the Secret only while one is under way. */}}
{{- define "vkgate.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ include "vkgate.secretName" .root }}
      key: {{ .name }}
      {{- if or .rotation (and .optional .root.Values.secrets.existingSecret) }}
      optional: true
      {{- end }}
{{- end -}}

{{/* A store's URL from its existing Secret or the chart's:
(dict "root" $ "store" .Values.database "name" "VKGATE_DATABASE_URL" "secret" <chart secret>). */}}
{{- define "vkgate.storeEnv" -}}
{{- if .store.existingSecret.name }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .store.existingSecret.name }}
      key: {{ .store.existingSecret.key }}
{{- else if .store.url }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .name }}
{{- end }}
{{- end -}}

{{- define "vkgate.metricsTokenEnv" -}}
{{- with .Values.metrics.tokenSecret }}
{{- if .name }}
- name: VKGATE_METRICS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .key }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A component's `env` map, then its `extraEnv` list: (dict "env" .env "extraEnv" .extra). */}}
{{- define "vkgate.userEnv" -}}
{{- range $name, $value := .env }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- with .extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The writable paths of a read-only root filesystem. */}}
{{- define "vkgate.scratchMounts" -}}
- name: tmp
  mountPath: /tmp
- name: home
  mountPath: /var/lib/vkgate
{{- end -}}

{{- define "vkgate.scratchVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
- name: home
  emptyDir:
    sizeLimit: 64Mi
{{- end -}}

{{- define "vkgate.preStop" -}}
{{- if gt (int .Values.preStopSleepSeconds) 0 }}
lifecycle:
  preStop:
    exec:
      command: ["sleep", {{ .Values.preStopSleepSeconds | int | toString | quote }}]
{{- end }}
{{- end -}}

{{/* A soft spread across nodes plus the user's constraints: (dict "root" $ "component" c
"values" .Values.proxy). */}}
{{- define "vkgate.topologySpread" -}}
{{- if or .values.spreadAcrossNodes .values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- if .values.spreadAcrossNodes }}
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "vkgate.selectorLabels" (dict "root" .root "component" .component) | nindent 8 }}
  {{- end }}
  {{- with .values.topologySpreadConstraints }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "vkgate.scheduling" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
