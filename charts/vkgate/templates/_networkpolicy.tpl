{{/* Egress rules shared by the NetworkPolicies. */}}

{{- define "vkgate.dnsEgress" -}}
# DNS.
- ports:
    {{- range .ports }}
    - port: {{ . }}
      protocol: UDP
    - port: {{ . }}
      protocol: TCP
    {{- end }}
  {{- with .to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* TCP ports, to the given peers or anywhere: (dict "comment" c "rule" {ports, to}). */}}
{{- define "vkgate.tcpEgress" -}}
# {{ .comment }}
- ports:
    {{- range .rule.ports }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
  {{- with .rule.to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
