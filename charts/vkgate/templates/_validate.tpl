{{/* Checks the schema cannot express. A message names the value, never repeats it: URLs and
secrets hold passwords. */}}
{{- define "vkgate.validate" -}}
{{- include "vkgate.validateStore" (dict "key" "database" "store" .Values.database "required" true "schemes" (list "postgresql://" "postgresql+") "form" "postgresql+psycopg://user:password@host:5432/vkgate") -}}
{{- include "vkgate.validateStore" (dict "key" "ledger" "store" .Values.ledger "required" true "schemes" (list "http://" "https://") "form" "http(s)://user:password@host:8123/database (a ClickHouse server: the image has no embedded chDB)") -}}
{{- include "vkgate.validateStore" (dict "key" "redis" "store" .Values.redis "required" false "schemes" (list "redis://" "rediss://" "unix://") "form" "redis://, rediss:// or unix://") -}}
{{- with .Values.secrets.encryptionKey -}}
{{- $standard := . | replace "-" "+" | replace "_" "/" | trimSuffix "=" -}}
{{- if or (ne (len $standard) 43) (ne (len (b64dec (printf "%s=" $standard))) 32) -}}
{{- fail "secrets.encryptionKey must be 32 random bytes in URL-safe base64 (43 characters and an optional =), as `python3 -c 'import base64,os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())'` prints" -}}
{{- end -}}
{{- end -}}
{{- if and (gt (int .Values.proxy.workers) 1) .Values.proxy.metrics.enabled -}}
{{- fail "proxy.workers above 1 needs proxy.metrics.enabled=false: each worker process counts only its own requests, so a scrape would see counters jump; scale with replicas instead" -}}
{{- end -}}
{{- if and .Values.proxy.autoscaling.enabled .Values.proxy.autoscaling.inFlight.enabled (not .Values.proxy.metrics.enabled) -}}
{{- fail "proxy.autoscaling.inFlight needs proxy.metrics.enabled: the in-flight gauge is read from the proxy's metrics" -}}
{{- end -}}
{{- if and .Values.proxy.autoscaling.enabled (gt (int .Values.proxy.autoscaling.minReplicas) (int .Values.proxy.autoscaling.maxReplicas)) -}}
{{- fail "proxy.autoscaling.minReplicas must not exceed proxy.autoscaling.maxReplicas" -}}
{{- end -}}
{{- with .Values.proxy.spool.persistence -}}
{{- if and .enabled (not .existingClaim) (not (has "ReadWriteMany" .accessModes)) -}}
{{- if or $.Values.proxy.autoscaling.enabled (gt (int $.Values.proxy.replicas) 1) -}}
{{- fail "proxy.spool.persistence.accessModes must include ReadWriteMany when the proxy runs more than one replica: every replica mounts the one claim" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "vkgate.validateStore" -}}
{{- if and .store.url .store.existingSecret.name -}}
{{- fail (printf "%s: set url or existingSecret.name, not both" .key) -}}
{{- end -}}
{{- if and .required (not .store.url) (not .store.existingSecret.name) -}}
{{- fail (printf "%s.url or %s.existingSecret.name is required: %s" .key .key .form) -}}
{{- end -}}
{{- with .store.url -}}
{{- $url := . -}}
{{- $known := false -}}
{{- range $.schemes -}}
{{- if hasPrefix . $url -}}{{- $known = true -}}{{- end -}}
{{- end -}}
{{- if not $known -}}
{{- fail (printf "%s.url must be %s (the value is not repeated here: it may hold a password)" $.key $.form) -}}
{{- end -}}
{{- end -}}
{{- end -}}
